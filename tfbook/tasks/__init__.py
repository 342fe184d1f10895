"""The book's training tasks, one module each, all with the same shape.

=================  =========  ==============================  ===========================
module             chapter    model                           metric (:func:`evaluate`)
=================  =========  ==============================  ===========================
``number_words``   12         EncoderDecoder                  exact match (greedy decoding)
``addition``       13         DecoderLM                       exact match (greedy decoding)
``corpus``         13         DecoderLM (characters)          bits per character
``digits``         15         VisionTransformer, 5 variants   accuracy
``muon``           10         DecoderLM, AdamW or Muon        exact match (greedy decoding)
=================  =========  ==============================  ===========================

Every module exposes the same verbs:

* ``data(...)`` -> :class:`Splits` ``(train, validation, test)``: training data for the
  optimiser, a validation split for every choice made from data (early stopping), and a
  test split read once, to report;
* ``config(...)`` -> the model's configuration; ``RECIPE``, the training settings;
* ``train(...)`` -> ``(model, History)``, through the one loop
  :func:`tfbook.torch.training.train`;
* ``evaluate(model, split)`` -> the task's metric on a split (a name or the data);
* ``load_pretrained(...)`` -> ``(model, History)``, the shipped weights and their history;
* ``save(model, history, folder)`` and ``main()``: ``python -m tfbook.tasks.NAME [--out DIR]``
  retrains and writes every artifact the package ships for the task (``ARTIFACTS``) into
  ``tfbook/weights/`` or ``DIR``.

Beside them, modules that train the models of other chapters (``retrieval``: chapters 4, 5
and 9; ``prose``: chapter 13; ``modern``: chapter 14) and two experiments that train many small
models and ship their measured results (and at most a few small weights): ``ablation``
(chapter 10: warm-up, clipping and weight decay, each removed in turn), ``dynamics`` (chapters 3
and 8: the score scale, Post-LN against Pre-LN with and without warm-up, rank collapse),
``lookups`` (chapter 5: one, two and four heads at equal width), ``lengths`` (chapter 7: four
position schemes trained on length 16, tested on 64), ``duplicates`` (chapters 6 and 9: a
classification encoder, class token against mean pooling, with and without positions),
``ends`` (chapter 6: the same encoder with and without positions on an order task, do the first
and last letters match?),
``datasize`` (chapter 15: a small CNN against the ViT on 150, 400 and all training images) and
``recall`` (chapter 17: softmax, sliding-window and linear attention on associative recall, the
learning rate chosen per model on validation). An experiment's verbs
are ``RECIPE``, ``ARTIFACTS``, ``train(...)`` (one run, or the whole experiment),
``load_pretrained()`` (the shipped result), ``save(result, folder)`` and ``main()``
(``python -m tfbook.tasks.NAME [--out DIR]``), plus ``data()`` and ``config()`` where one
model and one data set are trained.

The submodules are imported on first use (``tfbook.tasks.addition``), so that
``python -m tfbook.tasks.NAME`` runs the module once.
"""

import importlib as _importlib

from ._common import Splits

__all__ = ["Splits", "TASKS", "number_words", "addition", "corpus", "digits", "muon"]

TASKS = ("number_words", "addition", "corpus", "digits", "muon")


def __getattr__(name):
    if name in TASKS:
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
