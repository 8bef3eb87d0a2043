"""A loopback OpenAI-compatible ``/v1/completions`` server for tests (stdlib http.server + torch).

It serves the local checkpoint named by each request's ``model`` field (the run's ``--model``)
the way vLLM's server answers what lm-eval 0.4.13's ``local-completions`` client sends:

- loglikelihood: ``prompt`` = token-id lists, ``echo: true``, ``logprobs: 1``, ``max_tokens: 1``:
  per prompt token its logprob (``None`` for the first) and top-1 alternatives, plus one greedy
  token; lm-eval sums ``token_logprobs[ctxlen:-1]``;
- generate_until: ``prompt`` = token-id lists, greedy ``max_tokens`` tokens, text cut at the
  first ``stop`` string (OpenAI semantics: the stop string is not returned).

Faults for the failure tests, from the ``fail_after``-th request on: ``"500"`` (HTTP 500),
``"drop"`` (connection closed without an answer), ``"hang"`` (no answer for ``hang_s``),
``"null"`` (generations answered with ``"text": null``, as a reasoning model out of tokens does).
``served`` counts the completions answered (the "model calls" a cache saves); ``authorization``
keeps each request's Authorization header (where an API key went).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class CompletionsServer:
    def __init__(self, *, fault: str | None = None, fail_after: int = 0, hang_s: float = 30.0,
                 delay_s: float = 0.0, root: Path | None = None) -> None:
        self.root = root or Path.cwd()  # relative model names resolve here (the run's cwd)
        self.fault, self.fail_after, self.hang_s, self.delay_s = fault, fail_after, hang_s, delay_s
        self.served = 0
        self.received = 0
        self.authorization: list[str | None] = []  # each request's Authorization header
        self._models: dict[str, Any] = {}
        self._pieces: dict[int, list[str]] = {}  # per tokenizer: id -> decoded text
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1/completions"

    def start(self) -> CompletionsServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet test output
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                server._handle(self)

            def do_GET(self) -> None:  # noqa: N802 - no /tokenizer_info: lm-eval keeps its own tokenizer
                self.send_error(404)

        class Quiet(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that timed out and left: expected in the fault tests

        self._httpd = Quiet(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def preload(self, *names: str) -> CompletionsServer:
        """Load checkpoints now, so a first request does not wait for a model load."""
        for name in names:
            self._load(name)
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    # ------------------------------------------------------------------ requests

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        if h.path.split("?")[0].rstrip("/") != "/v1/completions":  # a key in the query string is the client's business
            h.send_error(404)
            return
        body = json.loads(h.rfile.read(int(h.headers.get("Content-Length") or 0)))
        with self._lock:
            self.received += 1
            self.authorization.append(h.headers.get("Authorization"))
            failing = self.fault is not None and self.received > self.fail_after
        if failing and self.fault == "500":
            _send(h, 500, {"error": {"message": "injected server error"}})
            return
        if failing and self.fault == "drop":
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        if failing and self.fault == "hang":
            time.sleep(self.hang_s)
            return
        if self.delay_s:
            time.sleep(self.delay_s)
        with self._lock:  # one forward pass at a time (CPU); answers stay deterministic
            answer = self._complete(body)
            self.served += 1
        _send(h, 200, answer)

    def _complete(self, body: dict) -> dict:
        model, tok = self._load(body["model"])
        prompts = body["prompt"]
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = [tok(p, add_special_tokens=False).input_ids if isinstance(p, str) else list(p) for p in prompts]
        if body.get("echo"):
            choices = [{"index": i, **c} for i, c in enumerate(self._echo(model, tok, prompts))]
        else:
            choices = []
            for i, ids in enumerate(prompts):
                text = None if self.fault == "null" else \
                    self._generate(model, tok, ids, int(body.get("max_tokens") or 16), body.get("stop"))
                choices.append({"index": i, "text": text, "logprobs": None, "finish_reason": "stop"})
        return {"id": "cmpl-test", "object": "text_completion", "model": body["model"], "choices": choices}

    def _echo(self, model: Any, tok: Any, batch: list[list[int]]) -> list[dict]:
        """One forward pass over the right-padded batch (a causal model's real positions never
        see the padding, as in lm-eval's hf backend); per prompt token its logprob and the top-1."""
        import torch

        width = max(len(ids) for ids in batch)
        inp = torch.tensor([ids + [0] * (width - len(ids)) for ids in batch])
        with torch.no_grad():
            lp = torch.log_softmax(model(inp, attention_mask=torch.ones_like(inp)).logits.float(), dim=-1)
        best_lp, best = lp.max(dim=-1)
        piece = self._pieces[id(tok)]
        out = []
        for row, ids in enumerate(batch):
            n = len(ids)
            actual = lp[row, torch.arange(n - 1), torch.tensor(ids[1:], dtype=torch.long)].tolist()
            arg, arg_lp = best[row, :n].tolist(), best_lp[row, :n].tolist()
            # the argmax last: if two tokens decode alike, the dict keeps the larger logprob
            top = [None] + [{piece[ids[p]]: actual[p - 1], piece[arg[p - 1]]: arg_lp[p - 1]} for p in range(1, n)]
            nxt = arg[n - 1]
            tokens = [piece[t] for t in [*ids, nxt]]
            out.append({"text": tok.decode([*ids, nxt]), "finish_reason": "length",
                        "logprobs": {"tokens": tokens, "token_logprobs": [None, *actual, arg_lp[n - 1]],
                                     "top_logprobs": [*top, {piece[nxt]: arg_lp[n - 1]}],
                                     "text_offset": [0] * len(tokens)}})
        return out

    def _generate(self, model: Any, tok: Any, ids: list[int], max_tokens: int, stop: Any) -> str:
        import torch

        room = model.config.n_positions - max_tokens
        ids = ids[-room:]
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=max_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id or tok.eos_token_id)
        text = tok.decode(out[0, len(ids):].tolist())
        for s in ([stop] if isinstance(stop, str) else stop or []):
            text = text.split(s)[0]
        return text

    def _load(self, name: str) -> tuple[Any, Any]:
        if name not in self._models:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            path = Path(name) if Path(name).is_absolute() else self.root / name
            model = AutoModelForCausalLM.from_pretrained(path, dtype="float32")
            model.eval()
            tok = AutoTokenizer.from_pretrained(path)
            self._pieces[id(tok)] = [tok.decode([i]) for i in range(len(tok))]
            self._models[name] = (model, tok)
        return self._models[name]


def _send(h: BaseHTTPRequestHandler, status: int, data: dict) -> None:
    raw = json.dumps(data).encode()
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(raw)))
    h.end_headers()
    h.wfile.write(raw)
