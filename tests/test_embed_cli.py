"""`mlxspec embed`: the engine's vectors as JSON lines, or their cosine similarities as a table;
texts from arguments, stdin and a file; errors said before anything loads."""

import io
import json

import numpy as np
import pytest

import tiny
from mlxspec.cli import main

TEXTS = ["rivers run to the sea", "the sea is where rivers end", "tax forms are due in April"]


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    from tiny_gguf import write_tiny_gguf

    path = tmp_path_factory.mktemp("embed") / "tiny.gguf"
    write_tiny_gguf(path, tied=False)
    return str(path)


@pytest.fixture(scope="module")
def reference(gguf):
    import mlxspec

    return mlxspec.load(gguf, "none", dtype="float32")


def test_json_lines_are_the_engine_s_vectors_of_texts_stdin_and_a_file(gguf, reference, tmp_path, monkeypatch,
                                                                        capsys):
    listed = tmp_path / "docs.txt"
    listed.write_text(f"{TEXTS[2]}\n\n")  # (blank lines are not inputs)
    monkeypatch.setattr("sys.stdin", io.StringIO(f"\n{TEXTS[1]}\n  \n"))
    assert main(["embed", "--target", gguf, "--dtype", "float32", TEXTS[0], "-", "--file", str(listed)]) == 0
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["index"] for line in lines] == [0, 1, 2]
    want = reference.embed(TEXTS)
    assert [line["tokens"] for line in lines] == want.tokens
    np.testing.assert_allclose([line["embedding"] for line in lines], np.array(want.vectors),
                               rtol=tiny.float32_tol(), atol=1e-6)
    assert "mean pooling" in err and f"embedded 3 texts ({sum(want.tokens)} tokens)" in err
    assert main(["embed", "--target", gguf, "--dtype", "float32", "--pooling", "last", "--normalize", "-1",
                 TEXTS[0]]) == 0
    raw = json.loads(capsys.readouterr().out)["embedding"]
    np.testing.assert_allclose(raw, np.array(reference.embed(TEXTS[0], pooling="last", normalize=-1).vectors[0]),
                               rtol=tiny.float32_tol(), atol=1e-6)


@pytest.mark.parametrize("normalize", ["2", "-1"])  # cosines whatever the vectors' lengths
def test_similarity_is_a_table_of_cosines(gguf, reference, capsys, normalize):
    assert main(["embed", "--target", gguf, "--dtype", "float32", "--similarity", "--normalize", normalize,
                 *TEXTS]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split() == ["1", "2", "3"] and len(rows) == 3
    v = np.array(reference.embed(TEXTS).vectors)
    for i, row in enumerate(rows):
        cells = row.split()
        assert cells[0] == str(i + 1) and row.endswith(TEXTS[i]) and cells[1 + i] == "1.000"
        np.testing.assert_allclose([float(c) for c in cells[1:4]], v[i] @ v.T, atol=6e-4)  # 3 decimals


@pytest.mark.parametrize("argv, code, says", [
    ([], 1, "nothing to embed: give one or more TEXTs"),
    (["--file", "/no/such/file.txt"], 1, "--file /no/such/file.txt: cannot read it"),
    (["x", "--normalize", "-2"], 2, "argument --normalize: must be an integer >= -1"),
    (["x", "--pooling", "cls"], 2, "invalid choice: 'cls'"),
    (["x", "--draft", "tiny.gguf"], 2, "unrecognized arguments: --draft"),
])
def test_bad_arguments_are_said_before_anything_loads(argv, code, says, capsys, monkeypatch):
    monkeypatch.setattr("mlxspec.commands.modelargs.load_engine", lambda *a, **k: pytest.fail("it loaded"))
    try:
        assert main(["embed", *argv]) == code
    except SystemExit as e:
        assert e.code == code
    assert says in capsys.readouterr().err


def test_help_says_every_option_s_default(capsys):
    with pytest.raises(SystemExit) as e:
        main(["embed", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "--similarity" in out and "/v1/embeddings" in out
    options = out.split("options:")[1].split("examples:")[0]
    entries = [e for e in options.split("\n  -") if e.strip() and not e.startswith("h, --help")]
    assert len(entries) >= 9
    for entry in entries:
        assert "default" in entry, entry
