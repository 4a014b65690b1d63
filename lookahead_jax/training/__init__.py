"""Training a model to be guessed: Jacobi-consistency fine-tuning (Kou et al., "CLLMs",
ICML 2024) in JAX with optax, so that lookahead's Jacobi window converges in fewer steps.

    trajectories.py  greedy outputs (fixed points) and every Jacobi state of their blocks
    layout.py        one forward pass holding prompt, fixed point and all Jacobi blocks
    loss.py          consistency (KL to the fixed point's distribution) + next-token loss,
                     the fixed point's distribution the model's own or the frozen base's
    train.py         optax loop, orbax train state (resume), the tuned checkpoint, and
                     mix (base + fraction * (trained - base))
    __main__.py      python -m lookahead_jax.training

The tuned model is an ordinary checkpoint: lookahead decoding of it is exact (greedy
equals its own plain greedy) like any other; what changes is how often guesses land.
"""

from lookahead_jax.training.loss import losses
from lookahead_jax.training.train import (
    TrainConfig,
    TrainingInterrupted,
    check_mix,
    mix,
    train,
    write_checkpoint,
)
from lookahead_jax.training.trajectories import (
    Trajectories,
    collect,
    load_trajectories,
    save_trajectories,
)

__all__ = [
    "TrainConfig",
    "Trajectories",
    "TrainingInterrupted",
    "check_mix",
    "collect",
    "load_trajectories",
    "losses",
    "mix",
    "save_trajectories",
    "train",
    "write_checkpoint",
]
