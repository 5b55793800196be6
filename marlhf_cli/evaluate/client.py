"""Asking an OpenAI-compatible chat model for verdicts: concurrency, retries, a disk cache.

**Retries: tenacity, with the ``openai`` client's own retries switched off**
(``max_retries=0``). The client's built-in retry has a fixed schedule (0.5 s doubling to at
most 8 s) that cannot be changed, hides how many attempts a request took, and keeps retrying
after the user pressed Ctrl-C or another worker hit a bad API key. With tenacity the
schedule is ``--retry-wait`` doubled per attempt (with jitter, at most 60 s, or longer when
the server's ``Retry-After`` asks for it), up to ``--max-retries`` retries, attempts are
counted per judgement for the summary, and every worker stops at once when one of them
finds the key or the model refused. Retried: 429 rate limits, 408/409, 5xx server errors,
timeouts (``--timeout`` per request) and dropped connections. Not retried: 400 (a pair the
model cannot take, e.g. too long: that judgement fails and is reported); 401/403/404 stop
the whole run with one line, since every other request would fail the same way; so does a
connection that cannot even be made (refused, or a host name that does not resolve) before
the server has answered once: that is a wrong ``--base-url``, not a busy server. After a
first reply, the same error is a server restarting, and is retried.

**Cache: one file per judgement**, ``judge/cache/<sha256>.json``, written atomically as soon
as its reply arrives, keyed by the model, the template's hash, the prompt and the two
responses *in the order shown* (plus temperature and the token limit). A rerun, or a run
resumed after a kill, reads the cache first and never pays for a reply twice; a kill can
lose at most the requests in flight. The raw reply is cached, not the parsed letter, so an
improved parser applies to old replies for free.

**The API key** is read from the environment (``$OPENAI_API_KEY`` or ``--api-key-env``),
handed to the client and nowhere else: never in the config, the cache, the result files or
a message; error texts from the server are scrubbed of it too (``redact``).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import random
import re
import socket
import threading
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from .. import artifacts
from ..errors import UserError

PAPER_MODEL = "gpt-4o-2024-05-13"
MAX_WAIT = 60.0
NO_KEY = "sk-no-key-required"  # local OpenAI-compatible servers (vLLM, llama.cpp) accept any


@dataclass
class Job:
    """One judgement: the message for one pair in one order, and its cache key."""

    tag: tuple  # (pair key, order): how the caller finds its result again
    message: str
    cache_key: str


@dataclass
class Outcome:
    tag: tuple
    reply: str | None = None
    error: str | None = None  # set when no reply came back (after retries)
    attempts: int = 0
    cached: bool = False
    extra: dict = field(default_factory=dict)


class Fatal(UserError):
    """A refusal every request would get (bad key, no such model): stop the whole run."""


def redact(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


def api_key(env_name: str, base_url: str | None) -> str:
    """The key from ``$env_name``; a placeholder for a custom server that needs none."""
    key = os.environ.get(env_name, "").strip()
    if key:
        return key
    if base_url or os.environ.get("OPENAI_BASE_URL"):
        return NO_KEY
    raise UserError(
        f"set ${env_name} to the judge's API key (or name another variable with --api-key-env), "
        "or point --base-url at a server that needs none"
    )


def _transient(err: BaseException) -> bool:
    import openai

    if isinstance(err, openai.APIConnectionError):  # includes APITimeoutError
        return True
    if isinstance(err, openai.APIStatusError):
        return err.status_code in (408, 409, 429) or err.status_code >= 500
    return False


def _cannot_connect(err: BaseException) -> OSError | None:
    """The operating system's reason when a connection could not be made at all (refused,
    a host name that does not resolve), found under the openai client's wrappers; None for
    timeouts, dropped connections and every other error."""
    import openai

    if not isinstance(err, openai.APIConnectionError) or isinstance(err, openai.APITimeoutError):
        return None
    seen, cause = set(), err.__cause__ or err.__context__
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, (ConnectionRefusedError, socket.gaierror)):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def _describe(err: BaseException) -> str:
    status = getattr(err, "status_code", None)
    name = type(err).__name__
    message = str(getattr(err, "message", "") or err).splitlines()[0] if str(err) else ""
    message = re.sub(r"^Error code: \d+ - ", "", message)[:200]
    return f"{name} {status}: {message}" if status else f"{name}: {message}" if message else name


class _Backoff:
    """tenacity wait: ``first * 2**(attempt-1)`` with +-25% jitter, at least the server's
    ``Retry-After``, at most 60 s."""

    def __init__(self, first: float):
        self.first = max(0.0, float(first))

    def __call__(self, state) -> float:
        delay = self.first * 2 ** (state.attempt_number - 1) * random.uniform(0.75, 1.25)
        err = state.outcome.exception() if state.outcome else None
        response = getattr(err, "response", None)
        header = response.headers.get("retry-after") if response is not None else None
        try:
            delay = max(delay, float(header)) if header is not None else delay
        except ValueError:
            pass
        return min(delay, MAX_WAIT)


class JudgeClient:
    """Thread-safe verdict requests for one model; see the module doc for the policies."""

    def __init__(
        self,
        *,
        model: str,
        key: str,
        base_url: str | None,
        timeout: float,
        max_retries: int,
        retry_wait: float,
        max_tokens: int,
        cache_dir: Path,
    ):
        from openai import OpenAI

        self.model = model
        self.max_retries = max_retries
        self.retry_wait = retry_wait
        self.max_tokens = max_tokens
        self.cache_dir = Path(cache_dir)
        self._secrets = [key]
        self._stop = threading.Event()
        self._answered = threading.Event()  # the server has replied once: it exists
        self._client = OpenAI(api_key=key, base_url=base_url, timeout=timeout, max_retries=0)

    # cache ------------------------------------------------------------------------------
    def cache_key(self, template_sha: str, prompt: str, first: str, second: str) -> str:
        material = {
            "model": self.model, "template": template_sha, "prompt": prompt, "first": first,
            "second": second, "temperature": 0, "max_tokens": self.max_tokens,
        }  # fmt: skip
        return hashlib.sha256(json.dumps(material, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    def _cache_path(self, key: str) -> Path:
        return self.cache_dir / f"{key}.json"

    def cached(self, job: Job) -> Outcome | None:
        path = self._cache_path(job.cache_key)
        if not path.is_file():
            return None
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return None  # unreadable: ask again (writes are atomic, so this is rare)
        return Outcome(job.tag, reply=entry.get("reply"), attempts=0, cached=True, extra=entry)

    # requests ---------------------------------------------------------------------------
    def _request(self, message: str) -> tuple[str | None, dict]:
        response = self._client.chat.completions.create(
            model=self.model,
            messages=[{"role": "user", "content": message}],
            temperature=0,
            max_tokens=self.max_tokens,
        )
        choice = response.choices[0] if response.choices else None
        usage = response.usage.model_dump() if getattr(response, "usage", None) else None
        info = {"served_model": response.model, "finish_reason": getattr(choice, "finish_reason", None), "usage": usage}
        return (choice.message.content if choice is not None else None), info

    def ask(self, job: Job) -> Outcome:
        """One judgement with retries; the reply is cached before this returns."""
        import openai
        from tenacity import RetryError, Retrying, retry_if_exception, stop_after_attempt, stop_when_event_set

        outcome = Outcome(job.tag)
        if self._stop.is_set():
            outcome.error = "cancelled"
            return outcome
        def retried(err: BaseException) -> bool:
            return _transient(err) and (self._answered.is_set() or _cannot_connect(err) is None)

        retrying = Retrying(
            retry=retry_if_exception(retried),
            stop=stop_after_attempt(self.max_retries + 1) | stop_when_event_set(self._stop),
            wait=_Backoff(self.retry_wait),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    outcome.attempts = attempt.retry_state.attempt_number
                    reply, info = self._request(job.message)
            self._answered.set()
        except RetryError:  # stopped by the event before an attempt finished
            outcome.error = "cancelled"
            return outcome
        except openai.OpenAIError as err:  # reported per judgement; a bug in marlhf still raises
            text = redact(_describe(err), self._secrets)
            if isinstance(err, (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError)):
                self._stop.set()
                raise Fatal(f"the judge server refused the request ({text}); check the model name and the API key") from None
            refused = _cannot_connect(err)
            if refused is not None and not self._answered.is_set():
                self._stop.set()
                reason = refused.strerror or str(refused)
                raise Fatal(f"cannot connect to the judge at {self._client.base_url} ({reason}); check --base-url and that the server runs") from None
            outcome.error = text
            return outcome
        created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        entry = {"model": self.model, "reply": reply, "attempts": outcome.attempts, "created": created, **info}
        artifacts.write_json(self._cache_path(job.cache_key), entry)
        outcome.reply, outcome.extra = reply, entry
        return outcome

    def run(self, jobs: Sequence[Job], concurrency: int, on_done: Callable[[Outcome], None]) -> list[Outcome]:
        """Every job's outcome (cached ones first, without a request), ``concurrency`` at a time.

        Jobs with the same cache key (the same message) share one request. A :class:`Fatal`
        refusal or Ctrl-C stops the workers: requests in flight finish, nothing new starts,
        and the exception propagates.
        """
        outcomes: list[Outcome] = []
        todo: dict[str, list[Job]] = {}
        for job in jobs:
            hit = self.cached(job)
            if hit is None:
                todo.setdefault(job.cache_key, []).append(job)
            else:
                outcomes.append(hit)
                on_done(hit)
        if not todo:
            return outcomes
        pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="judge")
        try:
            pending = {pool.submit(self.ask, same[0]): same for same in todo.values()}
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    outcome = future.result()  # raises Fatal
                    for job in pending.pop(future):
                        shared = Outcome(job.tag, outcome.reply, outcome.error, outcome.attempts, outcome.cached, outcome.extra)
                        outcomes.append(shared)
                        on_done(shared)
        except BaseException:
            self._stop.set()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return outcomes

    def redact(self, text: str) -> str:
        return redact(text, self._secrets)
