"""The ``saar`` command. A leaf: the library never imports it.

Exit status, as ``grep`` and ``diff`` use theirs (docs/cli.md, tested in tests/test_cli.py):

* 0: done (``check``: the config is usable);
* 1: the command ran and found a problem, or nothing: ``check`` found problems in the config
  (its schema included); ``replay show``: no such record; ``trace export``: no records;
  ``replay-trace``: failed requests; ``demo``: lock violations; ``bench``: a verdict not met;
* 2: it could not do its job (``Failed``, one line ``saar: ...``): bad usage, a config that does
  not load (``serve``, ``envoy-config``, ``replay what-if``...), a file that cannot be read or
  written, a server that does not answer or answers an error other than 404.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any


class Failed(Exception):
    """A known failure, told in one line (``saar: ...``); exit status 2."""


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("saar-extproc")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _serve(args: argparse.Namespace) -> int:
    from .service.app import serve_forever
    from .service.preflight import file_problems, port_problems

    config = _serve_config(args)
    problems = file_problems(config) + port_problems(config)
    if problems:
        raise Failed("cannot start:\n  " + "\n  ".join(problems))
    try:
        asyncio.run(serve_forever(config, reload=functools.partial(_serve_config, args,
                                                                   reloading=True)))
    except OSError as exc:           # a port taken meanwhile, a file gone, a sink unwritable
        raise Failed(f"cannot start: {exc}") from exc
    except RuntimeError as exc:
        if "Failed to bind" not in str(exc):
            raise
        raise Failed(f"cannot start: {str(exc).split(';')[0]} (in use?)") from exc
    return 0


def _serve_config(args: argparse.Namespace, *, reloading: bool = False) -> Any:
    """The config ``saar serve`` runs: the file's, with the flags' ports, pool and log level.
    Read at start, it also sets the log lines up (``logging``) and warns about a port;
    ``reloading`` (SIGHUP) it only reads."""
    from dataclasses import replace

    from .config import load_config
    from .observability import logs

    config = load_config(args.config)
    level: Any = args.log_level or ("debug" if args.verbose else None)  # argparse's choices
    if level is not None:
        config = replace(config, logging=replace(config.logging, level=level))
    if not reloading:
        logs.configure(config.logging.level, config.logging.format)
    server = config.server
    if args.grpc_port is not None and args.grpc_port != server.grpc_port and not reloading:
        logging.getLogger("saar").warning(
            "--grpc-port %d differs from server.grpc_port %d in %s: an Envoy bootstrap "
            "rendered from that config sends the ext_proc streams to %d (render it with "
            "`saar envoy-config --processor-port %d`)", args.grpc_port, server.grpc_port,
            args.config, server.grpc_port, args.grpc_port)
    if args.grpc_port is not None:
        server = replace(server, grpc_port=args.grpc_port)
    if args.http_port is not None:
        server = replace(server, http_port=args.http_port)
    if args.health_port is not None:
        server = replace(server, health_port=args.health_port)
    scheduling = config.scheduling
    if args.pool_name is not None:
        scheduling = replace(scheduling, pool_name=args.pool_name)
    return replace(config, server=server, scheduling=scheduling)


def _check(args: argparse.Namespace) -> int:
    """The config parses; its files, ports and (with Redis) store are usable from here. Exit
    1 when it found a problem, 2 when it could not look (no such file)."""
    from pathlib import Path

    from .config import ConfigError, load_config
    from .service.preflight import file_problems, port_problems, store_problems

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        if not Path(args.config).is_file():
            raise Failed(str(exc)) from exc
        print(exc, file=sys.stderr)
        return 1
    problems = file_problems(config)
    if not args.no_ports:
        problems += port_problems(config)
    if not args.no_store:
        problems += store_problems(config)
    if problems:
        print(f"{args.config}: {len(problems)} problem(s)", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        return 1
    server = config.server
    ports = [str(p) for p in (server.grpc_port, server.http_port, server.health_port) if p]
    print(f"{args.config}: OK: {len(config.models)} models ({', '.join(config.models)}), "
          f"logical {', '.join(config.routing.logical_models) or 'none'}; "
          f"state {config.state.store}; {'TLS' if server.tls.enabled else 'plaintext'} gRPC; "
          f"ports {', '.join(ports)} on {server.host}"
          + ("" if args.no_ports else " free"))
    return 0


def _provision(args: argparse.Namespace) -> int:
    from .service.provision import Certificate, Plan, Provisioner, RandomSecret, core_api

    randoms = []
    for spec in args.random:
        name, _, key = spec.partition("/")
        if not name or not key:
            raise Failed(f"--random {spec!r}: give SECRET/KEY")
        randoms.append(RandomSecret(name, key))
    certificate = None
    if args.tls_secret:
        if not args.ca or not args.dns_name:
            raise Failed("--tls-secret needs --ca and at least one --dns-name")
        certificate = Certificate(args.tls_secret, args.ca, tuple(args.dns_name), args.days)
    labels = dict(label.partition("=")[::2] for label in args.label)
    namespace = args.namespace or os.environ.get("POD_NAMESPACE")
    if not namespace:
        raise Failed("--namespace (or $POD_NAMESPACE) is required")
    plan = Plan(namespace, tuple(randoms), certificate, labels)
    for line in Provisioner(core_api(args.kubeconfig), plan).run():
        print(f"{namespace}: {line}")
    return 0


def _sim_server(args: argparse.Namespace) -> int:
    from .dev.sim.server import run

    run(args)
    return 0


def _envoy_config(args: argparse.Namespace) -> int:
    from .adapter.bootstrap import EnvoyPorts, ProcessorTls, render, render_fragment
    from .config import load_config

    config = load_config(args.config)
    addresses = tuple(args.processor)
    for address in addresses:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise Failed(f"--processor {address!r}: give HOST:PORT")
    tls = None
    client = (args.processor_client_cert, args.processor_client_key)
    if (client[0] is None) != (client[1] is None):
        raise Failed("--processor-client-cert and --processor-client-key go together")
    if config.server.tls.enabled:
        tls = ProcessorTls(args.processor_ca, args.processor_name, *client)
        if args.processor_ca is None:
            print("saar: server.tls.enabled: the processor clusters speak TLS without "
                  "verifying the certificate (give --processor-ca, and --processor-name "
                  "when the certificate names another host)", file=sys.stderr)
        if config.server.tls.client_ca_file and client[0] is None:
            print("saar: server.tls.client_ca_file: the processor asks for a client "
                  "certificate and Envoy presents none (give --processor-client-cert and "
                  "--processor-client-key)", file=sys.stderr)
    elif args.processor_ca or client[0]:
        raise Failed("--processor-ca / --processor-client-cert: server.tls.enabled is false "
                     "in the config: the processor serves plaintext")
    first = addresses[0].rpartition(":") if addresses else None
    ports = EnvoyPorts(
        listen=args.listen_port,
        admin=args.admin_port,
        processor_host=first[0] if first else args.processor_host,
        processor_port=int(first[2]) if first else (args.processor_port
                                                    or config.server.grpc_port),
        listen_host=args.listen_host,
        more_processors=addresses[1:],
        processor_tls=tls,
    )
    if args.fragment:
        sys.stdout.write(render_fragment(config, ports, source=args.config))
    else:
        sys.stdout.write(render(config, ports))
    return 0


def _replay_show(args: argparse.Namespace) -> int:
    if args.file:
        from .observability.replay import read_jsonl

        try:
            record = read_jsonl(args.file, args.replay_id)
        except OSError as exc:
            raise Failed(f"{args.file}: {exc.strerror or exc}") from exc
        if record is None:
            print(f"replay id {args.replay_id} not found in {args.file}", file=sys.stderr)
            return 1
    else:
        from .dev.records import admin_token

        url = f"{args.url.rstrip('/')}/v1/replay/{args.replay_id}"
        token = admin_token(args.token_file)
        request = urllib.request.Request(
            url, headers={"authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                record = json.load(response)
        except urllib.error.HTTPError as exc:
            detail = _error_text(exc)
            if exc.code == 404:
                print(f"replay id {args.replay_id} not found at {args.url}", file=sys.stderr)
                return 1
            raise Failed(f"{url}: HTTP {exc.code}{': ' + detail if detail else ''}") from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise Failed(f"{args.url}: no answer ({reason}); is saar serve running there? "
                         "(--url names its HTTP port)") from exc
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        from .observability.explain import explain

        print(explain(record))
    return 0


def _error_text(error: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(error.read()).get("error", ""))
    except (ValueError, AttributeError, OSError):
        return ""


def _trace_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .dev.records import load_records
    from .observability.timeline import timeline

    records = load_records(args.replay, args.url, args.token_file, args.session)
    document = timeline(records)
    Path(args.out).write_text(json.dumps(document))
    turns = sum(e["cat"] == "turn" for e in document["traceEvents"] if e["ph"] == "X")
    print(f"{args.out}: {document['otherData']['sessions']} sessions, {turns} turns "
          "(open it at https://ui.perfetto.dev or chrome://tracing)")
    return 0 if records else 1


def _replay_what_if(args: argparse.Namespace) -> int:
    from .config import load_config
    from .dev.records import load_records
    from .dev.whatif import table, what_if

    summary = what_if(load_records(args.replay, args.url, args.token_file, args.session),
                      load_config(args.config))
    print(json.dumps(summary) if args.json else table(summary))
    return 0


def _replay_trace(args: argparse.Namespace) -> int:
    from .dev.clustersim.trace import read_trace
    from .dev.trace_replay import Settings, replay, table

    settings = Settings(args.url, speed=args.speed, block_size=args.block_size,
                        model=args.model, api_key=args.api_key,
                        worker_metrics=tuple(args.worker_metrics))
    report = asyncio.run(replay(read_trace(args.trace), settings))
    print(json.dumps(report) if args.json else table(report))
    return 0 if report["ok"] == report["requests"] else 1


def _records_source(parser: argparse.ArgumentParser) -> None:
    """Where ``trace export`` and ``replay what-if`` read records from."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--replay", help="a replay JSONL file (replay.jsonl_path)")
    source.add_argument("--url", help="a processor's HTTP port, e.g. http://127.0.0.1:9090")
    parser.add_argument("--token-file", help="the admin token for --url (else $SAAR_ADMIN_TOKEN)")
    parser.add_argument("--session", help="only this session id")


def _demo(args: argparse.Namespace) -> int:
    from .dev.demo import run_demo

    return run_demo(args.config)


def _bench_overhead(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from .dev.bench.overhead import Settings, main

    settings = Settings(variants=tuple(args.variants.split(",")), warmup_s=args.warmup,
                        duration_s=args.duration, rounds=args.rounds, client=args.client,
                        upstream=args.upstream)
    if args.bodies:
        settings = replace(settings, bodies=tuple(args.bodies.split(",")))
    if args.concurrency:
        settings = replace(settings,
                           concurrencies=tuple(int(c) for c in args.concurrency.split(",")))
    return main(args.config, settings, as_json=args.json)


def _bench_route(args: argparse.Namespace) -> int:
    from .dev.bench.route import SIZES, main

    return main(args.config, tuple(args.sizes.split(",")) if args.sizes else tuple(SIZES),
                as_json=args.json)


def _bench_body(args: argparse.Namespace) -> int:
    from .dev.bench.body import DEFAULT_SIZES, VARIANTS, main

    return main(args.config, tuple(args.variants.split(",")) if args.variants else VARIANTS,
                tuple(args.sizes.split(",")) if args.sizes else DEFAULT_SIZES,
                as_json=args.json)


def _bench_store(args: argparse.Namespace) -> int:
    from .dev.bench.store import STORES, main

    return main(tuple(args.stores.split(",")) if args.stores else STORES, as_json=args.json)


def _bench_soak(args: argparse.Namespace) -> int:
    from .dev.bench.soak import Settings, main

    return main(args.config, Settings(minutes=args.minutes, rate=args.rate,
                                      window_s=args.window), as_json=args.json)


def _bench_hangup(args: argparse.Namespace) -> int:
    from .dev.bench.hangup import main

    return main(args.config, clients=args.clients, warmup=args.warmup,
                concurrency=args.concurrency, linger=args.linger, as_json=args.json)


def _bench_vsr(args: argparse.Namespace) -> int:
    from .dev.bench.vsr import SCENARIOS, main

    return main(args.script, args.config,
                tuple(args.scenarios.split(",")) if args.scenarios else tuple(SCENARIOS),
                args.output, tuple(args.variants.split(",")))


def _bench_peers(args: argparse.Namespace) -> int:
    from .dev.bench.peers.run import main
    from .dev.bench.peers.settings import Settings

    settings = Settings(
        backend=args.backend, routers=tuple(args.routers.split(",")),
        workloads=tuple(args.workloads.split(",")), sessions=args.sessions, turns=args.turns,
        rounds=args.rounds, seed=args.seed, oversubscription=args.oversubscription,
        workers=args.workers, c1_pairs=args.c1_requests, c16_seconds=args.c16_seconds,
        trace=args.trace, workdir=args.workdir)
    return main(settings, as_json=args.json)


def _eval_matrix(args: argparse.Namespace) -> int:
    from .dev.evaluation.cli import run

    return run(args)


def _eval_experiment(args: argparse.Namespace) -> int:
    from .dev.evaluation.cli import run_experiment

    return run_experiment(args)


def _simulate(args: argparse.Namespace) -> int:
    from .dev.clustersim.runner import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="saar", description="Session-aware routing of LLM agent traffic, as an Envoy "
        "external processor: the server, its tools and its benchmarks.")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="debug logging, and tracebacks instead of one-line errors")
    parser.add_argument("--version", action="version", version=f"saar {_version()}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the ext_proc server")
    serve.add_argument("--config", required=True, metavar="FILE", help="the service config")
    serve.add_argument("--grpc-port", type=int,
                       help="instead of server.grpc_port (warns: Envoy's bootstrap must agree)")
    serve.add_argument("--http-port", type=int,
                       help="instead of server.http_port (/metrics, /healthz, admin API, /ui)")
    serve.add_argument("--health-port", type=int,
                       help="plaintext gRPC health only (kubelet probes), beside a TLS port")
    serve.add_argument("--log-level", choices=("debug", "info", "warning", "error", "critical"),
                       help="instead of logging.level (-v: debug)")
    serve.add_argument("--pool-name", metavar="MODEL",
                       help="be the endpoint picker of this model's InferencePool")
    serve.set_defaults(func=_serve)

    check = sub.add_parser(
        "check", help="validate a config, the files it names, its ports and its store")
    check.add_argument("--config", required=True, metavar="FILE", help="the service config")
    check.add_argument("--no-ports", action="store_true",
                       help="do not try to bind the ports (checking on another machine)")
    check.add_argument("--no-store", action="store_true",
                       help="do not ping the shared store (state.store: redis)")
    check.set_defaults(func=_check)

    provision = sub.add_parser(
        "provision", help="create a release's missing Secrets in Kubernetes, never changing "
        "one that exists (the Helm chart's hook Job)")
    provision.add_argument("--namespace", help="the release's namespace (else $POD_NAMESPACE)")
    provision.add_argument("--random", action="append", default=[], metavar="SECRET/KEY",
                           help="an Opaque Secret with a random token under KEY (repeatable)")
    provision.add_argument("--tls-secret", metavar="SECRET",
                           help="a kubernetes.io/tls Secret signed by a CA of its own")
    provision.add_argument("--ca", metavar="NAME",
                           help="ConfigMap and Secret NAME with that CA's ca.crt (for gateways)")
    provision.add_argument("--dns-name", action="append", default=[], metavar="NAME",
                           help="a name the certificate is for (repeatable; first: subject)")
    provision.add_argument("--days", type=int, default=3650,
                           help="validity of a new certificate and CA (default 3650)")
    provision.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                           help="a label of every object created (repeatable)")
    provision.add_argument("--kubeconfig", metavar="FILE",
                           help="outside a pod: this kubeconfig (default ~/.kube/config)")
    provision.set_defaults(func=_provision)

    from .dev.sim.server import add_arguments

    sim = sub.add_parser("sim-server", help="run a simulated vLLM-like model server")
    add_arguments(sim)
    sim.set_defaults(func=_sim_server)

    envoy = sub.add_parser(
        "envoy-config", help="print the Envoy bootstrap for a config (or, with --fragment, "
        "what an existing Envoy adds)")
    envoy.add_argument("--config", required=True, metavar="FILE", help="the service config")
    envoy.add_argument("--fragment", action="store_true",
                       help="only the two ext_proc filters, the processor clusters and their "
                       "routes, for an Envoy of your own")
    envoy.add_argument("--listen-port", type=int, default=10000,
                       help="the port clients call (default 10000)")
    envoy.add_argument("--listen-host", default="127.0.0.1",
                       help="the address clients call (default 127.0.0.1; 0.0.0.0 for all)")
    envoy.add_argument("--admin-port", type=int, default=9901,
                       help="Envoy's admin port, always on 127.0.0.1 (default 9901)")
    envoy.add_argument("--processor-host", default="127.0.0.1",
                       help="where saar serve runs (default 127.0.0.1)")
    envoy.add_argument("--processor-port", type=int, default=None,
                       help="its gRPC port (default: the config's server.grpc_port; give the "
                       "same as saar serve --grpc-port)")
    envoy.add_argument("--processor", action="append", default=[], metavar="HOST:PORT",
                       help="a processor replica (repeatable; replaces --processor-host/-port)")
    envoy.add_argument("--processor-ca", metavar="FILE",
                       help="with server.tls.enabled: verify the processors' certificate with "
                       "this CA (path as Envoy sees it)")
    envoy.add_argument("--processor-name", metavar="NAME",
                       help="the name the certificate is for (default: the first processor's "
                       "host)")
    envoy.add_argument("--processor-client-cert", metavar="FILE",
                       help="with server.tls.client_ca_file: the client certificate Envoy "
                       "presents to the processors (path as Envoy sees it)")
    envoy.add_argument("--processor-client-key", metavar="FILE",
                       help="the private key of --processor-client-cert")
    envoy.set_defaults(func=_envoy_config)

    replay = sub.add_parser("replay", help="look up replay records")
    replay_sub = replay.add_subparsers(dest="replay_command", required=True)
    show = replay_sub.add_parser(
        "show", help="explain one routing decision (what matched, the lock or reset, the "
        "price, the worker)")
    show.add_argument("replay_id", help="the x-replay-id of a response (rp-...)")
    show.add_argument("--url", default="http://127.0.0.1:9090", help="the processor's HTTP port")
    show.add_argument("--file", help="read a JSONL sink file instead of asking the processor")
    show.add_argument("--token-file", help="the admin token (else $SAAR_ADMIN_TOKEN)")
    show.add_argument("--json", action="store_true", help="the whole record, as JSON")
    show.set_defaults(func=_replay_show)
    whatif = replay_sub.add_parser(
        "what-if", help="decide the recorded sessions again under another config; the difference")
    _records_source(whatif)
    whatif.add_argument("--config", required=True, help="the config to try")
    whatif.add_argument("--json", action="store_true", help="the summary as JSON")
    whatif.set_defaults(func=_replay_what_if)

    trace = sub.add_parser("trace", help="session timelines")
    trace_sub = trace.add_subparsers(dest="trace_command", required=True)
    export = trace_sub.add_parser("export", help="Chrome trace-event JSON (Perfetto)")
    _records_source(export)
    export.add_argument("--out", required=True, metavar="FILE", help="where to write the JSON")
    export.set_defaults(func=_trace_export)

    replay_trace = sub.add_parser(
        "replay-trace", help="send a Mooncake trace to a live endpoint with its timing")
    replay_trace.add_argument("--trace", required=True, help="Mooncake JSONL")
    replay_trace.add_argument("--url", required=True, help="the endpoint (Envoy's listener)")
    replay_trace.add_argument("--speed", type=float, default=1.0, help="time runs this much faster")
    replay_trace.add_argument("--block-size", type=int, default=16,
                              help="tokens per hash id (16: the processor's trace; 512: Mooncake)")
    replay_trace.add_argument("--model", default="auto",
                              help="the model every request asks for (default auto)")
    replay_trace.add_argument("--api-key", default="replay-trace",
                              help="the credential sent (the tenant the requests route under)")
    replay_trace.add_argument("--worker-metrics", action="append", default=[],
                              help="a worker's /metrics URL (repeat): its prefix-cache hit rate")
    replay_trace.add_argument("--json", action="store_true", help="the report as JSON")
    replay_trace.set_defaults(func=_replay_trace)

    demo = sub.add_parser("demo", help="start Envoy, the processor and sims; run an agent session")
    demo.add_argument("--config", default=None, metavar="FILE",
                      help="the service config (default: config/example.yaml)")
    demo.set_defaults(func=_demo)

    bench = sub.add_parser("bench", help="measure the stack on this machine")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    overhead = bench_sub.add_parser(
        "overhead", help="Envoy alone vs + pass-through processor vs + saar: latency and req/s"
    )
    overhead.add_argument("--json", action="store_true", help="last stdout line is JSON")
    overhead.add_argument("--config", default=None, help="default: config/example.yaml")
    overhead.add_argument("--variants", default="envoy,passthrough,saar",
                          help="comma-separated; also saar-redis, saar-two-streams, "
                          "saar-route-only, busy-<N> (the pass-through spending N "
                          "microseconds of CPU on each request body)")
    overhead.add_argument("--bodies", default=None, help="comma-separated body sizes")
    overhead.add_argument("--concurrency", default=None, help="comma-separated, e.g. 1,16")
    overhead.add_argument("--warmup", type=float, default=1.0, help="seconds per cell")
    overhead.add_argument("--duration", type=float, default=4.0, help="seconds per cell")
    overhead.add_argument("--rounds", type=_positive, default=1,
                          help="measure every cell this many times, the variants taking turns; "
                          "the verdicts are on the medians")
    overhead.add_argument("--client", choices=("auto", "wrk", "python"), default="auto",
                          help="load generator; auto = wrk if installed")
    overhead.add_argument("--upstream", choices=("canned", "sim"), default="canned",
                          help="canned = Envoy direct response; sim = sim-server --time-scale 0")
    overhead.set_defaults(func=_bench_overhead)
    route = bench_sub.add_parser(
        "route", help="the routing core alone on a growing agent session, beside the parse floor"
    )
    route.add_argument("--json", action="store_true", help="last stdout line is JSON")
    route.add_argument("--config", default=None, help="default: config/example.yaml")
    route.add_argument("--sizes", default=None, help="comma-separated: 2kb,64kb,256kb,1mb,4mb")
    route.set_defaults(func=_bench_route)
    body = bench_sub.add_parser(
        "body", help="the body phase over gRPC: saar beside a pass-through and an echo")
    body.add_argument("--json", action="store_true", help="last stdout line is JSON")
    body.add_argument("--config", default=None, help="default: config/example.yaml")
    body.add_argument("--sizes", default=None, help="comma-separated (default 1mb,4mb)")
    body.add_argument("--variants", default=None,
                      help="comma-separated, of passthrough,echo,saar,saar-no-rewrite")
    body.set_defaults(func=_bench_body)
    store = bench_sub.add_parser(
        "store", help="the shared store's load and apply: one Redis server beside a cluster")
    store.add_argument("--stores", default=None,
                       help="comma-separated store_server kinds (default redis,redis-cluster; "
                       "also valkey, valkey-cluster)")
    store.add_argument("--json", action="store_true", help="last stdout line is JSON")
    store.set_defaults(func=_bench_store)
    soak = bench_sub.add_parser(
        "soak", help="a stack under steady agent traffic for minutes: RSS, tables, series, "
        "tasks, latency per window")
    soak.add_argument("--minutes", type=float, default=10.0, help="how long (default 10)")
    soak.add_argument("--rate", type=float, default=None,
                      help="requests per second (default: half the measured ceiling)")
    soak.add_argument("--window", type=float, default=30.0, help="seconds per row (default 30)")
    soak.add_argument("--config", default=None, help="default: config/example.yaml")
    soak.add_argument("--json", action="store_true", help="last stdout line is JSON")
    soak.set_defaults(func=_bench_soak)
    hangup = bench_sub.add_parser(
        "hangup", help="clients that hang up before any answer: the processor's RSS and "
        "tables after them")
    hangup.add_argument("--clients", type=int, default=20_000,
                        help="clients measured, after the warm-up (default 20000)")
    hangup.add_argument("--warmup", type=int, default=2_000,
                        help="clients before the first sample (default 2000)")
    hangup.add_argument("--concurrency", type=int, default=32,
                        help="clients at a time (default 32)")
    hangup.add_argument("--linger", type=float, default=0.2,
                        help="seconds between sending and hanging up (default 0.2)")
    hangup.add_argument("--config", default=None, help="default: config/example.yaml")
    hangup.add_argument("--json", action="store_true", help="last stdout line is JSON")
    hangup.set_defaults(func=_bench_hangup)
    vsr = bench_sub.add_parser(
        "vsr", help="the Semantic Router's live benchmark through Envoy + saar, and direct to "
        "one worker for its overhead figure")
    vsr.add_argument("--script", required=True,
                     help="path to their bench/agentic_routing_live_benchmark.py")
    vsr.add_argument("--scenarios", default=None,
                     help="comma-separated (default: balanced,stateful-heavy,tool-heavy)")
    vsr.add_argument("--output", default="vsr-bench", help="their reports go here")
    vsr.add_argument("--variants", default="saar",
                     help="comma-separated, of saar,passthrough (the floor, in the same run)")
    vsr.add_argument("--config", default=None, help="default: config/example.yaml")
    vsr.set_defaults(func=_bench_vsr)
    from .dev.bench.peers import settings as peers_settings

    peers_defaults = peers_settings.Settings()
    peers = bench_sub.add_parser(
        "peers", help="the same workloads through saar, vllm-router and sglang-router "
        "(installed from PyPI on first use) over the same workers, in interleaved rounds")
    peers.add_argument("--backend", choices=peers_settings.BACKENDS, default=peers_defaults.backend,
                       help="the workers: sim (saar sim-server), vllm, dynamo")
    peers.add_argument("--routers", default=",".join(peers_defaults.routers),
                       help="comma-separated (default: all)")
    peers.add_argument("--workloads", default=",".join(peers_defaults.workloads),
                       help="comma-separated (default: all)")
    peers.add_argument("--sessions", type=_positive, default=peers_defaults.sessions,
                       help="agent sessions (and trace sessions) per workload")
    peers.add_argument("--turns", type=_positive, default=peers_defaults.turns,
                       help="requests per agent session (trace sessions: half)")
    peers.add_argument("--rounds", type=_positive, default=peers_defaults.rounds,
                       help="every router's turn this many times, the order rotated")
    peers.add_argument("--seed", type=int, default=peers_defaults.seed,
                       help="draws the sessions (each round its own from it)")
    peers.add_argument("--oversubscription", type=float,
                       default=peers_defaults.oversubscription,
                       help="live context over the pool's KV in the oversubscribed workload")
    peers.add_argument("--workers", type=_positive, default=peers_defaults.workers,
                       help="workers the sim backend starts")
    peers.add_argument("--c1-requests", type=_positive, default=peers_defaults.c1_pairs,
                       help="requests at concurrency 1, each beside one straight to a worker")
    peers.add_argument("--c16-seconds", type=float, default=peers_defaults.c16_seconds,
                       help="seconds at concurrency 16")
    peers.add_argument("--trace", default=None,
                       help="a Mooncake JSONL trace for the shared_prefix workload")
    peers.add_argument("--workdir", default=None, help="keep configs and logs here")
    peers.add_argument("--json", action="store_true", help="last stdout line is JSON")
    peers.set_defaults(func=_bench_peers)

    evaluation = sub.add_parser("eval", help="offline evaluations of the routing engine")
    eval_sub = evaluation.add_subparsers(dest="eval_command", required=True)
    matrix = eval_sub.add_parser("matrix", help="the SAAR article's deterministic policy matrix")
    from .dev.evaluation.cli import add_arguments as add_matrix_arguments

    add_matrix_arguments(matrix)
    matrix.set_defaults(func=_eval_matrix)
    experiment = eval_sub.add_parser(
        "experiment",
        help="vLLM Semantic Router's agentic-routing experiment (their script, workload and "
        "judge) through our router",
    )
    from .dev.evaluation.cli import add_experiment_arguments

    add_experiment_arguments(experiment)
    experiment.set_defaults(func=_eval_experiment)

    simulate = sub.add_parser(
        "simulate", help="discrete-event simulation of routing policies on agentic traffic"
    )
    from .dev.clustersim.runner import add_arguments as add_simulate_arguments

    add_simulate_arguments(simulate)
    simulate.set_defaults(func=_simulate)
    _verbose_after_commands(parser)
    return parser


def _verbose_after_commands(parser: argparse.ArgumentParser) -> None:
    """``-v`` after a command too (``saar serve --config F -v``, as the chart's extraArgs
    append it): every subcommand takes it, without resetting one given before the command."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for command in action.choices.values():
            if "--verbose" not in command._option_string_actions:
                command.add_argument("-v", "--verbose", action="store_true",
                                     default=argparse.SUPPRESS,
                                     help="debug logging, and tracebacks instead of one-line "
                                     "errors (as before the command)")
            _verbose_after_commands(command)


def main(argv: Sequence[str] | None = None) -> int:
    from .config import ConfigError

    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpx2", "openai", "anthropic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return int(args.func(args))
    except (ConfigError, Failed) as exc:
        if args.verbose and isinstance(exc, Failed):
            raise
        print(f"saar: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file named on the command line (or in a config) is unusable
        if args.verbose or exc.filename is None:
            raise
        print(f"saar: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # a tool's ``raise SystemExit("why")``: a known failure too
        if not isinstance(exc.code, str):
            raise
        print(f"saar: {exc.code}", file=sys.stderr)
        return 2
