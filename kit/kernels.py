"""Where a batch runs its points - one warm notebook kernel, point after point, or torchrun for a
data-parallel point - and how a scheduler's signal reaches the point that runs: the names, as
`from kit.kernels import Kernels` has always found them. The code is kit.cluster's: the kernel's
lifecycle (kit.cluster.kernels, whose docstring says why one warm kernel), the signals and the
one rule they follow (kit.cluster.signals: SIGTERM, SIGUSR1 and Ctrl-C's SIGINT do nothing in a
kernel but while fit() runs, and the batch passes them on until fit() has them) and torchrun
(kit.cluster.torchrun).
"""
from kit.cluster.kernels import KERNEL_ARGS, KERNEL_NAME, RESET, Kernels, prepare_kernels  # noqa: F401
from kit.cluster.signals import (ARM, FORWARD, RESEND_S, Forwarder,  # noqa: F401
                                 forwarding_signals)
from kit.cluster.torchrun import (TORCHRUN_SIGNALS, run_torchrun, torchrun_command,  # noqa: F401
                                  torchrun_knows, torchrun_signal)
