"""Training: THE loop (loop) and the jobs it runs (finetune: `fit(cfg)` and the single-task
job; multitask), with what a loop needs: optimizer (optim), precision (accel), checkpoints and
resume (run_state), dev metrics (metrics), progress bars and trackers.
Imports the layers below (kit.config, kit.data, kit.models, kit.methods) and kit.io, kit.runs."""
