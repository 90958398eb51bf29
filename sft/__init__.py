"""sft: the FSDP1 trainer (`python -m sft.train config.yaml`) and checkpoint tools."""
