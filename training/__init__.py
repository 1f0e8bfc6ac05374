"""Training of the embedded model: tokenizer, target, P-EAGLE and EAGLE-3 drafters.

Run on a GPU machine with ``python -m training.pipeline --out DIR``; see
training/README.md. Everything here is plain PyTorch + transformers +
tokenizers, so it runs on the lent H200's image without installs.
"""
