"""Load a target sharded over an `mx.distributed` group, and a replicated draft.

Every rank resolves and loads the same references (lazily, so a tensor-parallel or
pipeline shard reads only the weights it keeps), then the ranks compare fingerprints of
what they loaded (`mlxspec.loading.fingerprint`) in one all-sum: a rank that failed, or
whose weights or tokenizer differ, makes every rank raise instead of hanging or computing
garbage. Then the target is sharded (`mlxspec.shard`) and evaluated, and a last
collective makes sure every rank holds its shard before the first request.
"""

from __future__ import annotations

import dataclasses
import logging
import sys

import mlx.core as mx

from ..distributed import Coordinator
from ..errors import MlxSpecError
from ..modelmeta import weights_bytes
from ..shard import shard_model
from .fingerprint import files_fingerprint, tokenizer_fingerprint, value_fingerprint
from .model import load_model

log = logging.getLogger("mlxspec.loading")
LOAD_TIMEOUT = 900.0  # seconds a rank waits for the others to load: a slow disk reads a large checkpoint


def load_sharded(target_ref, draft_ref, *, group, dtype=None, download=True, settings=None, head=None, adapter=None):
    """(target_model, tokenizer, target_info, draft_model, draft_tokenizer, draft_info) with the target sharded.

    `settings`: the options every rank must share besides the files (flag -> value: --dtype,
    --max-kv-size, the KV quantization...), compared with the files' fingerprints; `head`: the
    EAGLE head's folder, whose files are compared too (a rank without it could not follow);
    `adapter`: an `mlx_lm.lora` adapter folder, folded into the target's weights before they are
    sharded (`adapters.fuse_adapter`), its files compared too.

    `target_info.sharding` says how ("tensor", "pipeline", "tensor-mlp"); its `weights_bytes`
    is this rank's share.

    Raises:
        IncompatibleModelsError: the target supports no sharding over `group` (on every rank).
        DistributedError: another rank failed to load, or loaded different weights or tokenizers.
        ModelNotFoundError, MlxSpecError: this rank failed to load (the others raise DistributedError).
    """
    coord = Coordinator(group, timeout=LOAD_TIMEOUT)
    # A rank with another --dtype once read the decisions' int64 all-sum against float16 bytes and
    # "finished" its request at once: options are compared as the files are.
    prints = {"target weights": 0, "tokenizer": 0, "draft weights": 0, "head files": 0, "adapter files": 0,
              **{name: value_fingerprint(value) for name, value in (settings or {}).items()}}
    error = None
    draft_model = draft_tokenizer = draft_info = None
    try:
        target_model, tokenizer, target_info = load_model(target_ref, dtype=dtype, download=download, lazy=True,
                                                          adapter_path=adapter, fuse_adapter=adapter is not None)
        prints["target weights"] = files_fingerprint(target_info.path)
        if adapter is not None:
            from .adapters import adapter_digest

            prints["adapter files"] = value_fingerprint(adapter_digest(adapter))
        prints["tokenizer"] = tokenizer_fingerprint(tokenizer)
        if draft_ref is not None:
            draft_model, draft_tokenizer, draft_info = load_model(draft_ref, dtype=dtype, download=download, draft=True)
            prints["draft weights"] = files_fingerprint(draft_info.path)
        if head is not None:
            prints["head files"] = files_fingerprint(head)
    except (MlxSpecError, OSError) as e:
        error = e
        # Said here, before the ranks compare notes: `agree` then raises the group's verdict,
        # which names the ranks that failed but not why.
        sys.stderr.write(f"mlxspec: rank {group.rank()}: {e}\n")
        sys.stderr.flush()
    coord.agree(prints, failed=error is not None)
    if error is not None:
        raise error
    how = shard_model(target_model, group)
    mx.eval(target_model.parameters())
    coord.gather([1], "the other ranks' shards")  # every rank holds its shard
    log.info("rank %d of %d: target sharded (%s)", group.rank(), group.size(), how)
    target_info = dataclasses.replace(target_info, weights_bytes=weights_bytes(target_model), sharding=how)
    return target_model, tokenizer, target_info, draft_model, draft_tokenizer, draft_info
