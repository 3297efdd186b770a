"""The names users choose among (drafters, precisions), apart from the modules that implement
them (which import MLX and mlx-lm), so command-line parsing and the pair registry can name them
without that start-up cost."""

DRAFTERS = ("model", "eagle", "ngram", "none")  # the names Engine and load accept
WEIGHTLESS_DRAFTERS = ("ngram", "none")  # need no weights of their own
DTYPES = ("auto", "quantized", "bfloat16", "float16", "float32")  # load's dtype, --dtype
KV_BITS = (2, 3, 4, 5, 6, 8)  # bits per cached key and value (what mx.quantize packs)
KV_GROUP_SIZES = (32, 64, 128)  # values sharing a scale and a bias
DEFAULT_KV_GROUP_SIZE = 64  # mlx-lm's
DEFAULT_QUANTIZED_KV_START = 5000  # mlx-lm's command line: short contexts stay exact
POOLINGS = ("mean", "last")  # how embeddings pool the final hidden states (mlxspec.embed)
