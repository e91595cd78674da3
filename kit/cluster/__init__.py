"""Where a batch's points run and how a signal reaches them: the warm notebook kernel
(`kernels`), one point in it or under torchrun (`point`, `torchrun`), the signals a batch passes
on to the point that runs and the one rule they follow (`signals`), the grid as its run folders
record it and the lines a batch ends with (`grid`), and the script a SLURM cluster runs a grid
with (`slurm_script`). The doors (kit.batch, kit.run, kit.slurm) are made of it.
It imports the layers below it (kit.config, kit.runs, kit.train: the signals a run stops on,
its progress lines, the pre-flight), never a door.
"""
