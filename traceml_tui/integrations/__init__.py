"""Trainer integrations: Hugging Face ``Trainer`` and Lightning ``Trainer`` on the SDK (docs/trainers.md).

* :mod:`traceml_tui.integrations.hf` — ``TraceMLCallback``, a transformers ``TrainerCallback``;
* :mod:`traceml_tui.integrations.lightning` — ``TraceMLCallback``, a ``lightning.pytorch`` ``Callback``
  (:mod:`traceml_tui.integrations.pytorch_lightning` for the ``pytorch_lightning`` namespace);
* :mod:`traceml_tui.integrations.bootstrap` — what `traceml run` starts each rank through: it installs
  import hooks (:mod:`traceml_tui.integrations.hooks`) that add those callbacks to every trainer the
  script builds, then runs the script as ``__main__``.

Nothing here imports a framework until the script (or the user) does.
"""
