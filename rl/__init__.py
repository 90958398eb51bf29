"""rl: GRPO on the project's environments through TRL's `environment_factory` API.

    launch stage=grpo task=spa|qa model=<recipe> [model.path=<SFT checkpoint>] seed=0 steps=250

Modules:
    chat        the training-side chat template TRL accepts (renders every prompt as the model's own
                template does) and the tool-call parser TRL uses (evals.toolcalls, one implementation)
    envs        the TRL environments: `spa` (SearchPlanActEnv) and `qa` (a `search` tool over the
                evals retrievers), their reward functions and training-row streams
    config      the `stage=grpo` config: its keys, validation, run directory and run identity
    checkpoint  merged full-weight checkpoints (+ adapter/), the step-000000 copy, resumable state
    train       the trainer (`python -m rl.train <run_dir>/config.yaml`, under torchrun)

Import order (DESIGN.md): rl may import common, sft, envs and evals' public API; nothing imports rl
except launch, which composes the config (launch.compose.compose_grpo) and starts the trainer
(launch.grpo: dry run, local torchrun, Slurm); rl imports no launch.
"""
