"""`mlxspec serve` on the command line: flags, their defaults, and the warning for an open bind."""

import os
import types

import pytest

from mlxspec.cli import COMMANDS, main
from mlxspec.errors import InvalidArgumentError
from mlxspec.serve import ServeOptions
from mlxspec.serve import server as server_module
from mlxspec.serve.server import bind_warning

FLAGS = ["--pair", "--target", "--draft", "--drafter", "--host", "--port", "--api-key", "--max-kv-size", "--queue",
         "--num-draft", "--max-tokens", "--temperature", "--max-body-size", "--shutdown-grace", "--dtype",
         "--prompt-cache-size", "--prompt-cache-bytes", "--allow-origin", "--client-timeout", "--responses-dir"]


def test_help_explains_every_flag_with_its_default(capsys):
    assert "serve" in COMMANDS
    with pytest.raises(SystemExit) as e:
        main(["serve", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    for flag in FLAGS:
        assert flag in out
    for default in ("127.0.0.1", "8080", "default: 16", "default: 512", "8388608"):
        assert default in out
    # Every option's help says what happens when it is left out.
    options = out.split("options:")[1].split("examples:")[0]
    entries = [e for e in options.split("\n  -") if e.strip() and not e.startswith("h, --help")]
    assert len(entries) >= len(FLAGS)
    for entry in entries:
        assert "default" in entry, entry


@pytest.fixture
def captured(monkeypatch):
    """Run `mlxspec serve` without loading a model or binding: record what it would serve."""
    calls = {}
    from mlxspec.commands import modelargs

    monkeypatch.setattr(modelargs, "load_engine", lambda args, **kw: calls.setdefault("load", (args, kw)) and "engine")
    monkeypatch.setattr("mlxspec.commands.generate.load_line", lambda engine: f"loaded {engine}")  # (no real engine)
    monkeypatch.setattr(server_module, "serve", lambda engine, options: calls.setdefault("serve", options) and 0)
    monkeypatch.setattr(server_module, "check_address", lambda host, port: None)  # a server on 8080 here is fine
    return calls


def test_a_taken_port_or_unknown_host_is_said_before_the_model_loads(monkeypatch, capsys):
    import socket

    from mlxspec.commands import modelargs

    monkeypatch.setattr(modelargs, "load_engine", lambda *a, **k: pytest.fail("must fail before loading"))
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 1
        assert f"cannot listen on 127.0.0.1:{port}: Address already in use (another server is listening there" \
            in capsys.readouterr().err
    finally:
        taken.close()
    assert main(["serve", "--host", "no-such-host.invalid"]) == 1
    assert "--host 'no-such-host.invalid': no such address here" in capsys.readouterr().err


def test_flags_reach_the_server_options(captured, monkeypatch):
    monkeypatch.delenv("MLXSPEC_API_KEY", raising=False)
    assert main(["serve", "--port", "9001", "--queue", "3", "--max-tokens", "64", "--temperature", "0.5",
                 "--drafter", "none", "--num-draft", "4", "--shutdown-grace", "2"]) == 0
    opts = captured["serve"]
    assert (opts.host, opts.port, opts.queue, opts.max_tokens, opts.temperature, opts.api_key) == \
           ("127.0.0.1", 9001, 3, 64, 0.5, None)
    assert opts.shutdown_grace == 2 and opts.client_timeout == 30
    assert opts.chat_template_args is None and opts.pooling == "mean"
    captured.pop("serve")
    assert main(["serve", "--pooling", "last"]) == 0 and captured["serve"].pooling == "last"
    captured.pop("serve")
    assert main(["serve", "--chat-template-args", '{"enable_thinking": false}']) == 0
    assert captured["serve"].chat_template_args == {"enable_thinking": False}
    captured.pop("serve")
    assert main(["serve", "--reasoning-effort", "high", "--chat-template-args", '{"enable_thinking": false}']) == 0
    assert captured["serve"].chat_template_args == {"reasoning_effort": "high", "enable_thinking": False}
    assert captured["load"][1] == {"drafter": "none", "num_draft": 4, "tree": None, "prompt_cache_size": 4,
                                   "prompt_cache_bytes": None}


def test_template_variables_the_model_does_not_read_are_said_at_start(captured, monkeypatch, caplog):
    from types import SimpleNamespace

    from mlxspec.commands import modelargs

    engine = SimpleNamespace(tokenizer=SimpleNamespace(chat_template="{% if enable_thinking %}<think>{% endif %}"))
    monkeypatch.setattr(modelargs, "load_engine", lambda args, **kw: engine)
    assert main(["serve", "--reasoning-effort", "high", "--chat-template-args", '{"enable_thinking": false}']) == 0
    said = [r.getMessage() for r in caplog.records if "does not read" in r.getMessage()]
    assert said == ["this model's chat template does not read reasoning_effort: it changes nothing"]


def test_allowed_origins_reach_the_server_options(captured):
    assert main(["serve", "--allow-origin", "https://chat.example.com/", "--allow-origin", "http://10.0.0.2:3000"]) == 0
    assert captured["serve"].allow_origins == ("https://chat.example.com", "http://10.0.0.2:3000")


def test_the_prompt_cache_size_reaches_the_engine(captured):
    assert main(["serve", "--prompt-cache-size", "0", "--prompt-cache-bytes", "1.5GiB"]) == 0
    assert captured["load"][1]["prompt_cache_size"] == 0
    assert captured["load"][1]["prompt_cache_bytes"] == 3 * 2**29


@pytest.mark.parametrize("text, size", [("2000", 2000), ("512MB", 512 * 10**6), ("2 GiB", 2**31), ("0", 0)])
def test_sizes_are_read_with_their_units(text, size):
    from mlxspec.commands.argtypes import size_bytes

    assert size_bytes(text) == size


def test_the_body_limit_takes_a_size_with_its_unit(captured, capsys):
    assert main(["serve", "--max-body-size", "16MB"]) == 0 and captured["serve"].max_body_size == 16 * 10**6
    captured.pop("serve")
    assert main(["serve", "--max-body-size", "65536"]) == 0 and captured["serve"].max_body_size == 65536
    for bad in ("0", "16XB"):
        with pytest.raises(SystemExit):
            main(["serve", "--max-body-size", bad])
    err = capsys.readouterr().err
    assert "expected a size of at least 1 byte" in err and "expected a size such as" in err


def test_tree_and_lookup_flags_reach_the_engine(captured):
    assert main(["serve", "--tree", "off", "--lookup", "off"]) == 0
    assert captured["load"][1]["tree"] == "off" and captured["load"][1]["lookup"] is False


@pytest.mark.parametrize("key", ["ключ", " padded ", "", "tab\tkey"])
def test_a_key_no_client_could_send_is_refused_at_start(captured, key, capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--api-key", key])
    assert "must be printable ASCII" in capsys.readouterr().err and "serve" not in captured


def test_api_key_comes_from_the_environment_when_not_given(captured, monkeypatch):
    monkeypatch.setenv("MLXSPEC_API_KEY", "from-env")
    assert main(["serve"]) == 0 and captured["serve"].api_key == "from-env"


@pytest.mark.parametrize("argv", [["--queue", "-1"], ["--port", "70000"], ["--max-tokens", "0"],
                                  ["--prompt-cache-size", "-2"], ["--prompt-cache-bytes", "lots"],
                                  ["--prompt-cache-bytes", "5TB"], ["--allow-origin", "chat.example.com"],
                                  ["--allow-origin", "https://x.example/api"], ["--allow-origin", "http://x:0"],
                                  ["--chat-template-args", "think"], ["--chat-template-args", '{"tools": []}'],
                                  ["--chat-template-args", "[1]"], ["--pooling", "cls"]])
def test_bad_flags_fail_with_what_is_allowed(captured, argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", *argv])
    assert e.value.code == 2 and argv[0] in capsys.readouterr().err


def test_binding_beyond_loopback_without_a_key_warns(monkeypatch, capsys):
    assert "--api-key" in bind_warning("0.0.0.0", None)
    assert "--api-key" in bind_warning("192.168.1.5", None)
    assert bind_warning("0.0.0.0", "key") is None
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert bind_warning(host, None) is None
    queue = types.SimpleNamespace(stop=lambda: None, fatal=None)
    stub = types.SimpleNamespace(run=lambda: None, started=True, force_exit=False,
                                 mlxspec=types.SimpleNamespace(queue=queue))
    monkeypatch.setattr(server_module, "build_server", lambda engine, options: stub)
    assert server_module.serve("engine", ServeOptions(host="0.0.0.0")) == 0
    assert "warning: serving on 0.0.0.0 without --api-key" in capsys.readouterr().err


@pytest.mark.parametrize("started, fatal, status", [(True, None, 0), (True, "lost the ranks", 1), (False, None, 1)])
def test_the_exit_status_says_whether_the_server_served_and_stopped_as_asked(monkeypatch, started, fatal, status):
    """0 only when it started and stopped on a signal; a failed start-up, or an engine that broke
    (EngineQueue.fatal), is 1 so that a supervisor restarts it."""
    queue = types.SimpleNamespace(stop=lambda: None, fatal=fatal)
    stub = types.SimpleNamespace(run=lambda: None, started=started, force_exit=False,
                                 mlxspec=types.SimpleNamespace(queue=queue))
    monkeypatch.setattr(server_module, "build_server", lambda engine, options: stub)
    assert server_module.serve("engine", ServeOptions()) == status


class _Coord:
    def __init__(self, is_main):
        self.active, self.is_main = True, is_main


class _ShardedEngine:
    """A rank of a sharded target: records what the serve command asks of it."""

    def __init__(self, is_main):
        self.coord, self.calls = _Coord(is_main), []

    def warmup(self, temperatures):
        self.calls.append(("warmup", tuple(temperatures)))

    def follow(self):
        self.calls.append(("follow",))
        return 0

    def release(self):
        self.calls.append(("release",))


@pytest.mark.parametrize("is_main", [True, False])
def test_distributed_ranks_other_than_0_follow_and_rank_0_serves_then_releases(monkeypatch, is_main):
    from mlxspec.commands import modelargs

    from mlxspec.serve.queue import warmup_temperatures

    engine, served = _ShardedEngine(is_main), []
    monkeypatch.setattr(modelargs, "load_engine", lambda args, **kw: engine)
    monkeypatch.setattr("mlxspec.commands.generate.load_line", lambda e: "loaded")  # (a stand-in engine)
    monkeypatch.setattr(server_module, "serve", lambda e, options: served.append(e) or 0)
    assert main(["serve", "--distributed"]) == 0
    if is_main:
        assert served == [engine] and engine.calls == [("release",)]  # the server warms itself up
    else:  # no HTTP: warm up with the server's passes, then run rank 0's requests
        assert served == [] and engine.calls == [("warmup", warmup_temperatures()), ("follow",)]


def test_the_responses_folder_is_made_at_start_or_refused(captured, tmp_path, capsys):
    assert main(["serve"]) == 0 and captured.pop("serve").responses_dir is None
    assert main(["serve", "--responses-dir", str(tmp_path / "kept" / "here")]) == 0
    assert captured["serve"].responses_dir == str(tmp_path / "kept" / "here") and (tmp_path / "kept" / "here").is_dir()
    captured.clear()
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(SystemExit) as e:
        main(["serve", "--responses-dir", str(tmp_path / "a-file" / "sub")])
    assert e.value.code == 2 and "--responses-dir" in capsys.readouterr().err and "load" not in captured


def test_a_request_s_reasoning_effort_wins_over_the_server_s():
    from mlxspec.serve.options import ServeOptions
    from mlxspec.serve.schema import parse_chat

    defaults = ServeOptions(chat_template_args={"reasoning_effort": "high", "enable_thinking": False})
    ask = {"messages": [{"role": "user", "content": "hi"}]}
    assert parse_chat(ask, defaults).options["chat_template_kwargs"] == {"reasoning_effort": "high",
                                                                         "enable_thinking": False}
    own = parse_chat(dict(ask, reasoning_effort="low"), defaults).options["chat_template_kwargs"]
    assert own == {"reasoning_effort": "low", "enable_thinking": False}


def test_a_port_a_stopped_server_left_in_time_wait_is_free_to_serve_again():
    """Restarting right after a stop: the old connections linger in TIME_WAIT, which uvicorn binds
    past (SO_REUSEADDR), so the check before loading must not refuse the port either."""
    import socket

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    served, _ = listener.accept()
    served.close()  # the server closes first, as on shutdown: its side waits in TIME_WAIT
    client.close()
    listener.close()
    plain = socket.socket()  # without SO_REUSEADDR the port is still taken: the case this test is about
    try:
        with pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))
    finally:
        plain.close()
    server_module.check_address("127.0.0.1", port)


@pytest.mark.parametrize("name, hint", [("EACCES", "ports below 1024 need privileges"), ("EADDRNOTAVAIL", None)])
def test_a_refused_bind_says_why_only_when_it_knows(monkeypatch, name, hint):
    import errno
    import socket

    code = getattr(errno, name)

    class Refusing:
        def __init__(self, *args):
            pass

        def setsockopt(self, *args):
            pass

        def bind(self, address):
            raise OSError(code, os.strerror(code))

        def close(self):
            pass

    names = ("getaddrinfo", "gaierror", "SOCK_STREAM", "AI_PASSIVE", "SOL_SOCKET", "SO_REUSEADDR")
    monkeypatch.setattr(server_module, "socket", types.SimpleNamespace(
        socket=Refusing, **{name: getattr(socket, name) for name in names}))
    with pytest.raises(InvalidArgumentError) as e:
        server_module.check_address("127.0.0.1", 80)
    said = str(e.value)
    assert said.startswith(f"cannot listen on 127.0.0.1:80: {os.strerror(code)}")
    assert (hint in said) if hint else not said.endswith(")"), said
