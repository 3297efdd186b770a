"""Train an EAGLE head (mlxspec/drafters/eagle_head.py) for a target by self-distillation, offline:
the target answers prompts, the head learns to predict its next hidden state and token.

    mlxspec train-eagle --target REF --out my-head --prompt-file chats.jsonl
    mlxspec generate --target REF --head my-head "..."      # then draft with it (or name it in a pair)

--target is any target mlxspec loads: a Hugging Face repo id, an MLX folder (quantized or not) or
a GGUF, of the llama, qwen2/qwen3, mistral, phi3 or gemma 1, 2 and 3 families, granite, cohere or
gpt-oss (any whose logits are a linear head of its final hidden state, or that head soft-capped as
Gemma 2's or scaled as Granite's and Cohere's: the head's laws are capped or scaled the same way).
Every stage runs in MLX on its default device: a Mac's GPU, an NVIDIA GPU through MLX's CUDA
backend, or the CPU. With your own chats as --prompt-file (the prompts your users send), the head
drafts what your target answers to them. How long: a head that drafts as well as the demo one
took 11 minutes on an NVIDIA H200, 164 on 2 x86 cores with PyTorch (its model card:
mlxspec/data/smollm2-eagle/README.md).
In a checkout, scripts/train_eagle.py takes the same flags, and --gguf: the PyTorch trainer the
demo head was made with on a 2-core x86 CPU, where MLX's CPU backend is slower.

Stages (each cached under --work, by default a folder of mlxspec's cache named by the target and
the answers' settings, so a rerun skips what is finished; a stopped train stage
resumes from its last checkpoint):
  1. prompts    train_draft.py's offline templated prompts (the first --held-out held out), plus
                every --prompt-file's prompts (JSONL, mlx-lm's "prompt" or "messages" format:
                your own chats, or a checkout's scripts/code_prompts.py's), all trained on
  2. generate   the target's own answers (held-out greedy; train batches alternately greedy and
                at T=0.7), keeping the hidden states the generation computes anyway, float16:
                the final ones (after the final norm: what `backbone.split_model` gives the
                engine) and the outputs of the --feature-layers (`backbone.tapped`);
                --generate-precision bfloat16 runs these passes in bfloat16 (kept apart)
  2b. layers    the --feature-layers' outputs for shards generated without them (one pass over
                their cached answers, about 360 entries/s on 2 threads)
  3. vocab      the draft vocabulary: the --draft-vocab most frequent tokens of the data
                (cached per data size: appended shards give a new one); with --init, the
                head's own, widened by the data's most frequent others to a larger --draft-vocab
  4. train      fc(concat(embed(x[j+1]), f[j])) -> decoder layer -> norm, trained on smooth-L1
                to f[j+1] plus cross-entropy to the target's distribution of x[j+2] (within the
                draft vocabulary) on the entries that predict answer tokens (--loss-on); with
                feature layers (EAGLE-3), a real entry's f[j] is fc_layers(their outputs at j).
                Inputs get noise, and unrolled steps feed the head its own predicted features
                with the attention a drafting step has (EAGLE's robustness to drafting on its
                own output). Checkpoints are named by the data size and settings, so a rerun
                resumes the same run and never reuses a head trained on other data; a run
                that starts over beside an unfinished one names it and the flags between them.
                With --init HEAD the run continues an exported head instead (its shape and
                draft vocabulary, which a larger --draft-vocab widens), e.g. the shipped one on
                your own --prompt-file.
                With --context target the head attends to the target's own last-layer keys and
                values (from the tapped input of that layer; GLIDE's idea) instead of keeping
                its own of every real entry (`mlxspec/drafters/context.py`).
  5. export     float16 MLX weights + config.json with the target's identity

With --target, the answers come from mlx-lm's batched generation and the features from one
teacher-forced pass of the engine's own backbone split (train_eagle_mlx.py, eagle_mlx_data.py;
the objective: eagle_objective.py, checked against step-by-step drafting). With --gguf, the target
runs in PyTorch (never used by mlxspec at run time; threads capped at --threads), dequantized by
transformers with its weights rounded to bfloat16: stages 2-3 in eagle_data.py, 4 in
eagle_torch.py, and what both trainers share (settings, batches, masks, the run's name) in
eagle_training.py, all in mlxspec/training/.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from . import train_common
from .draft_prompts import PROMPT_FILE_HELP

# Light on purpose: `mlxspec --help` builds this parser, so nothing here imports NumPy or MLX.
# The exported head's window (`--window`): about as long as most sequences the demo recipe trains
# on (a prompt, median 64 tokens, and up to 128 answer tokens). After 3,000 tokens of conversation
# the demo head drafted far better with a window of 256 than with none, and a little better than
# with 512 (model card, "Long conversations").
WINDOW = 256
ANSWER_SETTINGS = ("max_new", "temperature", "seed", "held_out")  # with the target: what the answers depend on


def add_arguments(p: argparse.ArgumentParser, *, pytorch: bool = True) -> None:
    """The command's flags, on parser `p`: scripts/train_eagle.py's, or without the PyTorch
    trainer's (`pytorch` False: --gguf and the flags only it reads) `mlxspec train-eagle`'s."""
    target = dict(metavar="REF", help="any target mlxspec loads (Hugging Face repo id, MLX folder, quantized or not, "
                                      "or GGUF), run by MLX on its default device: a Mac's GPU, an NVIDIA GPU or the "
                                      "CPU; no PyTorch")
    if pytorch:
        which = p.add_mutually_exclusive_group(required=True)
        which.add_argument("--gguf", help="the target's GGUF, run by PyTorch on the CPU (how the demo head was made)")
        which.add_argument("--target", **target)
    else:
        p.add_argument("--target", required=True, **target)
        p.set_defaults(gguf=None, threads=None, precision="float32", generate_precision="float32",
                       made_by="mlxspec train-eagle")  # the head's training record names its maker
    p.add_argument("--adapter-path", metavar="PATH",
                   help="with --target: a fine-tuned adapter folder written by mlx_lm.lora, applied to the target "
                        "as mlxspec --adapter-path applies it; the head learns the adapted target's answers and "
                        "features (draft with the head under the same adapter: mlxspec --adapter-path, or a pair "
                        "naming both; default: none)")
    p.add_argument("--work", metavar="FOLDER",
                   help="where the stages' results are cached, so a rerun resumes. "
                        "Default: a folder of mlxspec's cache ($MLXSPEC_HOME) named by the target, the adapter and "
                        "the answers' settings; the log says which. It can hold gigabytes of features: delete it "
                        "once the head is exported")
    p.add_argument("--out", metavar="FOLDER",
                   help="the head folder to write (required; mlxspec/data/smollm2-eagle, the shipped demo head's, "
                        "only for the demo target)")
    p.add_argument("--seed", type=train_common.non_negative_int, default=0,
                   help="seeds the templated prompts' choice, the sampled answers and training (default 0)")
    if pytorch:
        p.add_argument("--threads", type=train_common.positive_int, default=2,
                       help="PyTorch threads (--gguf only; default 2: the performance cores)")
    p.add_argument("--stop-after", choices=["generate", "layers", "train", "export"], default="export",
                   help="end after this stage (default: export, the whole recipe); a later run resumes from it")
    # data (train_draft.py's generate stage)
    p.add_argument("--prompts", type=train_common.non_negative_int, default=4032,
                   help="templated train prompts (half answered greedily, half at T); 0 for none")
    p.add_argument("--prompt-file", action="append", default=[], metavar="JSONL", help=PROMPT_FILE_HELP)
    p.add_argument("--held-out", type=train_common.positive_int, default=32,
                   help="templated prompts kept out of training, answered greedily, for the agreement printed "
                        "each checkpoint (default 32)")
    p.add_argument("--max-new", type=train_common.positive_int, default=128,
                   help="most tokens of each answer (default 128)")
    p.add_argument("--temperature", type=train_common.non_negative_float, default=0.7,
                   help="of the answers not made greedily (every other batch; default 0.7; 0: all greedy)")
    p.add_argument("--gen-batch", type=train_common.positive_int, default=train_common.GEN_BATCH,
                   help="prompts answered together. On 2 cores in bfloat16, 192 answered short prompts 1.5x as "
                   "fast as 48 and long ones (code) 0.8x as fast. Another size writes its own shards, vocabulary "
                   "and runs (its batches hold other prompts)")
    p.add_argument("--finished-only", action="store_true",
                   help="train on the shards a (maybe still running) generate stage has finished; generate nothing")
    # head
    p.add_argument("--draft-vocab", type=train_common.positive_int,
                   help="tokens the head may propose: the data's most frequent (default 4096; with --init, the "
                   "head's own, and a larger number widens it by the data's most frequent tokens it lacks)")
    p.add_argument("--intermediate", type=train_common.positive_int,
                   help="the head's MLP width (default: the target's). A wider one still starts as the target's last "
                   "layer, its extra units silent. The shipped demo head is 2x (3072): after 8 "
                   "epochs and 4 more with --init at --lr 3e-4 it gained 0.020 per token over the 1x head and "
                   "ran x1.05 as fast on a 2-core CPU, at 1.5x the head step and training time (model card)")
    p.add_argument("--head-layers", type=train_common.positive_int, default=1,
                   help="decoder layers in the head (EAGLE uses 1; each costs about one target layer per draft step)")
    p.add_argument("--context", choices=["head", "target"], default="head",
                   help="what the head's attention reads for the positions the target has run: its own keys and "
                        "values of them (EAGLE; the shipped demo head), or the target's own last-layer keys and "
                        "values from the target's cache (as GLIDE does; Du et al. 2024): then the head keeps only "
                        "the current round's entries, and training taps the input of the target's last layer. For "
                        "the demo target it learnt faster at first and ended 0.011 per token behind (the demo head's "
                        "EXPERIMENTS.md)")
    p.add_argument("--window", type=train_common.non_negative_int, default=WINDOW,
                   help="entries of its own cache the exported head attends to (its latest, plus the first 4), "
                        "written to its config as `window`; 0: all of them. A head learns on sequences of a few "
                        "hundred tokens and drafts worse the further back it attends: after 3,000 tokens of "
                        "conversation the demo head's per-token acceptance was 0.27 attending to all and 0.60 with "
                        f"a window of 256 (model card, \"Long conversations\"). Default {WINDOW}; "
                        "with --context target it is not used (that head keeps no cache of its own)")
    p.add_argument("--feature-layers", default="final",
                   help="what the head reads for a committed position: 'final' (the target's final hidden state, "
                        "EAGLE-1; the shipped demo head), 'auto' (the outputs of EAGLE-3's low, middle and high "
                        "layer: 2, n/2-1, n-4 of n), or a comma list of layers")
    # training
    p.add_argument("--epochs", type=train_common.positive_float, default=3.5,
                   help="passes over the answers; the demo head before the wider one used 8 on 5,323 prompts, 86 "
                        "minutes from scratch on 2 CPU cores (bench-suite per-token acceptance 0.40 after 4, 0.42 "
                        "after 8; 4 more with --init at --lr 3e-4 gave 0.43 but no speed); the shipped, twice as "
                        "wide head 8 and then 4 more that way")
    p.add_argument("--train-minutes", type=train_common.positive_float, metavar="M",
                   help="a wall-clock budget for the train stage: after timing its first steps, a run that would "
                        "take longer is cut to the steps that fit, its learning-rate schedule ending there (the log "
                        "says where); for a GPU lent by the hour. A cut run is a run of its own: the same command "
                        "without the budget trains all --epochs rather than reusing it. Default: no budget, all "
                        "--epochs")
    p.add_argument("--batch", type=train_common.positive_int, default=8, help="sequences per step (default 8)")
    p.add_argument("--lr", type=train_common.positive_float, default=1e-3,
                   help="AdamW's peak learning rate, after a 3 %% warm-up, then cosine (default 1e-3)")
    p.add_argument("--noise", type=train_common.non_negative_float, default=0.1,
                   help="uniform input-feature noise, fraction of feature RMS (default 0.1)")
    p.add_argument("--unroll", type=train_common.positive_int, default=2,
                   help="drafting steps simulated per entry (1 = teacher forcing only; default 2)")
    p.add_argument("--unroll-weight", type=train_common.non_negative_float, default=0.8,
                   help="loss weight of each further unrolled step, as a power (default 0.8)")
    p.add_argument("--ce-weight", type=train_common.non_negative_float, default=0.3,
                   help="weight of the token loss beside the feature regression (default 0.3)")
    p.add_argument("--loss-on", choices=["answers", "all"], default="answers",
                   help="entries the loss covers: those predicting answer tokens (what the engine drafts), or all")
    if pytorch:
        p.add_argument("--precision", choices=["float32", "bfloat16"], default="float32",
                       help="arithmetic of the training steps (--gguf only): bfloat16 autocasts them, the weights and "
                            "the optimiser stay float32; about 1.5x faster on CPUs with bfloat16 dot products "
                            "(AVX512-BF16), slower on those without. Held-out checks run in float32")
        p.add_argument("--generate-precision", choices=["float32", "bfloat16"], default="float32",
                       help="arithmetic of the target's passes that write the answers and their features (--gguf "
                            "only): bfloat16 autocasts them, 4.1x as fast on a 2-core CPU with bfloat16 dot "
                            "products. Its features differ from float32's by about 1 %% RMS (the training noise is "
                            "5.8 %%) and about half its greedy answers part from float32's at a near tie; its answers "
                            "are kept apart "
                            "(eagle-gen-bfloat16 in --work) and never mixed with float32's")
    p.add_argument("--ckpt-every", type=train_common.positive_int, default=100,
                   help="steps between checkpoints (and held-out agreement lines; default 100): a rerun resumes "
                        "from the last one")
    p.add_argument("--pair", metavar="NAME",
                   help="after the export, add a pair NAME to your own models.toml ($MLXSPEC_HOME/models.toml): "
                        "this target (and --adapter-path), the head, drafter eagle; then `mlxspec chat --pair NAME` "
                        "or `serve --pair NAME` drafts with it. A name that is there for another target or head, "
                        "or a curated pair's, is refused before any work (default: none added)")
    p.add_argument("--init", metavar="HEAD",
                   help="continue training this exported head (a folder or builtin:NAME, e.g. builtin:smollm2-eagle) "
                        "instead of starting from the target's last layer: its shape, feature layers and draft "
                        "vocabulary replace --intermediate and --feature-layers (a larger --draft-vocab widens its "
                        "vocabulary). Adapting the shipped head to your --prompt-file takes minutes; use a lower "
                        "--lr (e.g. 3e-4)")


def check(p: argparse.ArgumentParser, args) -> None:
    """What argparse cannot check alone (flags that exclude each other, folders it cannot write), said
    by `p.error` before any work."""
    if 0 < args.window < 5:
        p.error(f"--window {args.window}: at least 5 (the head's first 4 entries are always kept), or 0 for all")
    if args.head_layers < 1:
        p.error(f"--head-layers {args.head_layers}: a head needs at least one decoder layer")
    if args.context == "target" and (args.head_layers != 1 or args.feature_layers != "final"):
        p.error("--context target: the head is one decoder layer that reads the target's final hidden state "
                "(--head-layers 1, --feature-layers final); it attends to the target's last layer's keys and values")
    for flag, value in (("--precision", args.precision), ("--generate-precision", args.generate_precision)):
        if args.target and value != "float32":
            p.error(f"{flag} {value}: only the PyTorch trainer (--gguf) autocasts; --target runs in MLX, "
                    "in the target's own precision")
    if args.adapter_path and not args.target:
        p.error("--adapter-path needs --target: the PyTorch trainer (--gguf) runs the demo target as it is")
    if not args.out:  # no default: a trial run must not replace a head anyone relies on
        p.error("--out is required: the folder to write the head to (--out mlxspec/data/smollm2-eagle replaces the "
                "shipped demo head, which only the demo target may)")
    if not args.work:
        args.work = str(default_work(args))
    for flag, folder in (("--out", args.out), ("--work", args.work)):
        if why := train_common.unwritable_folder(Path(folder)):
            p.error(f"{flag} {folder}: {why}")
    if why := unwritable_out(Path(args.out)):
        p.error(f"--out {args.out}: {why}")


def pair_entry(args) -> dict | None:
    """The [[pair]] that --pair adds (None without it): paths absolute, since the file is elsewhere."""
    if not args.pair:
        return None
    entry = {"name": args.pair, "target": target_ref(args), "head": str(Path(args.out).resolve()), "drafter": "eagle"}
    if args.adapter_path:
        entry["adapter"] = str(Path(args.adapter_path).resolve())
    return entry


def target_ref(args) -> str:
    """The target as one reference wherever the command runs from: a local file or folder made
    absolute (a --gguf always is one), else as given (a Hugging Face repo id)."""
    ref = args.target or args.gguf
    return str(Path(ref).resolve()) if args.gguf or Path(ref).exists() else ref


def default_work(args) -> Path:
    """The work folder when --work is not given: one per target (`target_ref`), adapter and way of
    answering, so that changing one starts a folder of its own rather than being refused by the
    first run's (`eagle_data.check_work`)."""
    from mlxspec.paths import cache_dir

    ref = target_ref(args)
    key = json.dumps([ref, args.adapter_path and str(Path(args.adapter_path).resolve()),
                      *(getattr(args, k) for k in ANSWER_SETTINGS)])
    name = Path(ref.rstrip("/")).name or "target"
    return cache_dir() / "train-eagle" / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


SHIPPED = Path(__file__).resolve().parent.parent / "data" / "smollm2-eagle"


def check_out(args, digest: str) -> None:
    """--out may be the shipped head's folder only for the demo target's GGUF (`digest`: its
    SHA-256, `target_digest`)."""
    from mlxspec.loading.demo import MODELS

    if Path(args.out).resolve() == SHIPPED.resolve() and digest not in {m.gguf_sha256 for m in MODELS.values()}:
        raise SystemExit(f"--out {args.out} is the shipped demo head, which only the demo target may replace; "
                         f"give another folder for {args.gguf}")


def unwritable_out(out: Path) -> str:
    """Why a head may not be written to folder `out` ("" when it may): one holding something
    other than an EAGLE head (a model, say) would be overwritten."""
    config = out / "config.json"
    names = {f.name for f in out.iterdir()} if out.is_dir() else set()
    from mlxspec.files import staged_path

    # save_head stages both files (`staged_path`), then renames them: an export cut short leaves
    # only those, or the weights renamed beside the staged config
    weights, staged_config = staged_path("model.safetensors").name, staged_path("config.json").name
    if staged_config in names:
        names.discard("model.safetensors")
    if names - {weights, staged_config}:
        try:
            kind = json.loads(config.read_text(encoding="utf-8")).get("model_type")
        except (OSError, ValueError, AttributeError):
            kind = None
        if kind != "eagle_head":
            return ("holds files but no EAGLE head (config.json with model_type \"eagle_head\"); writing the head "
                    "there would overwrite them: give a new or empty folder, or an earlier head's")
    return ""


