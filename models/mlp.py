"""The multilayer perceptron workload: ``jobman.models.mlp:train``.

An example of a jobman experiment: parameters in, the standard results out,
learning curves through ``channel.log``, checkpoints in the job's workdir, and
a relaunched job picking up where its last checkpoint left off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jobman.dispatch.channel import Channel

from . import layers
from .classifier import TRAIN_DEFAULTS, fit
from .parallel import gang_of
from .params import int_list, job_params, settings
from .plugins import Plugin
from .splits import SPLIT_DEFAULTS, make_split

DEFAULTS: dict[str, Any] = {**SPLIT_DEFAULTS, **TRAIN_DEFAULTS, "nhid": 256, "activation": "relu", "ps": False}


def train(state: dict, channel: Channel, plugins: Sequence[Plugin] = ()) -> str:
    """Train an MLP classifier; the results land in ``state``.

    Model: ``nhid`` (256; an int or a list of layer sizes), ``activation``
    ("relu"; or "tanh", "sigmoid"), ``seed`` (0). Training: see
    :data:`jobman.models.classifier.TRAIN_DEFAULTS` (``optimizer="adam"``,
    ``lr=2e-3``, ``batch_size=64``, ``epochs=100`` at most, ``input_noise=0.1``,
    validation every ``eval_every=10000`` examples, early stopping after
    ``patience=20`` validations, learning rate divided by ``lr_factor=5`` after
    ``lr_patience=5``, ...). Data: the parameters of :mod:`jobman.models.splits`
    (``dataset="digits"``, ``nb_cross_fold``, ``id_cross_fold``, ...).
    ``plugins`` adds plugins to the training loop. ``ps=1`` in a job of ``--ranks N`` (N >= 2, its ranks
    started through mpiexec, the ``ps`` extra installed) trains data-parallel, the weights and the optimizer's
    slots in the parameter server: see :mod:`jobman.models.parallel`.
    """
    p = settings(job_params(state, channel), DEFAULTS)
    if not p.ps:
        del p["ps"]  # out of the checkpoint's fingerprint: a run of one process resumes as it did before ps=
    ps = gang_of(channel) if p.get("ps") else None
    channel.bind(state)
    split = make_split(p)
    rng = np.random.default_rng(p.seed)
    net = layers.mlp([split.n_features, *int_list(p.nhid), split.n_classes], p.activation, rng)
    return fit(net, split, p, channel, state, rng, plugins=plugins, ps=ps)
