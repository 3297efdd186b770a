"""The drafters' names, apart from the drafters themselves (which import MLX and mlx-lm), so that
command-line parsing and the pair registry can name them without that start-up cost."""

DRAFTERS = ("model", "eagle", "ngram", "none")  # the names Engine and load accept
WEIGHTLESS_DRAFTERS = ("ngram", "none")  # need no weights of their own
