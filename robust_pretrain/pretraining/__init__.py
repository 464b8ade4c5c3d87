"""What a recipe runs: argument dataclasses, data + model + trainer, outputs.

``pos_mlm`` pre-trains a masked LM over part-of-speech tasks, ``multimae`` a multi-modal masked autoencoder over
image modalities, ``causal_lm`` a decoder over data domains (each a subpackage: ``recipe``, ``arguments``, ``data``,
``model``); ``compare`` runs several weighting strategies (of either recipe) and tabulates them; ``common`` holds the
machinery every pre-training recipe shares (output directory and resume checks, logging, the final report / plot /
card / push sequence). Each recipe's ``main(argv)`` is a console script.
"""
