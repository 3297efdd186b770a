"""Trainers for drafters, by self-distillation from the target: an EAGLE head (`mlxspec
train-eagle`, train_eagle.py; its flags in eagle_args.py) and the demo draft model (train_draft.py).
Nothing here runs at inference; PyTorch is imported only by the stages of scripts/train_eagle.py
--gguf and scripts/train_draft.py.
"""
