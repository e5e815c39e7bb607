"""``goodtrace demo``: a real small training job that shows what goodtrace reports.

A GPT-style character model (a few hundred thousand parameters, :mod:`.model`) is trained with
DistributedDataParallel on CPU ranks (gloo) over the corpus shipped here (``corpus.txt``), with
a data loader, checkpoints, evaluations, an injected crash and an automatic restart from the
last checkpoint (:mod:`.train` is one rank, :mod:`.launcher` starts and restarts the ranks).
Needs PyTorch (``pip install 'goodtrace[demo]'``); nothing here is imported by ``goodtrace``.
"""
