"""The names users choose among (drafters, precisions), apart from the modules that implement
them (which import MLX and mlx-lm), so command-line parsing and the pair registry can name them
without that start-up cost."""

DRAFTERS = ("model", "eagle", "ngram", "none")  # the names Engine and load accept
WEIGHTLESS_DRAFTERS = ("ngram", "none")  # need no weights of their own
DTYPES = ("auto", "quantized", "bfloat16", "float16", "float32")  # load's dtype, --dtype
