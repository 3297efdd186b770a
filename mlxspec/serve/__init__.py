"""`mlxspec serve`: an OpenAI-compatible HTTP server in front of one speculative engine.

    app.py        the Starlette app: routes, middleware, error shapes, shared state
    generation.py chat and text completions, whole or as server-sent events
    translated.py the Responses and Messages APIs, answered as chats
    ollama.py     Ollama's bodies in and answers out; ollama_routes.py its routes
    infill.py     llama.cpp's /infill: code completion at the cursor
    choice.py     one choice's answer: reasoning split off, tool calls, logprobs
    body.py       request bodies: size limit, JSON, unread fields
    auth.py       the API key
    schema.py     request bodies -> checked engine arguments (400s name the field)
    messages.py   chat messages and completions' prompts, checked
    responses.py  OpenAI response and chunk shapes, usage, the `mlxspec` figures
    queue.py      one engine on one worker thread; ordered, bounded, cancellable jobs
    errors.py     OpenAI error objects and the status of each engine error
    options.py    ServeOptions, what the command line sets
    server.py     uvicorn with a clean SIGINT/SIGTERM shutdown

    from mlxspec.serve import ServeOptions, serve
    serve(mlxspec.load("demo"), ServeOptions(port=8080))
"""

_LAZY = {"ServeOptions": "options", "make_app": "app", "build_server": "server", "serve": "server"}


def __getattr__(name):
    # Lazy, so `mlxspec --help` (which reads ServeOptions' defaults) does not import the web stack.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'mlxspec.serve' has no attribute {name!r}")


__all__ = list(_LAZY)
