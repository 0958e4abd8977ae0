"""make demo: the main job on the embedded default, step by step, then clean up.

1. start the local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok fake NPU nodes);
2. install the CRD, run the operator (reconciler and admission webhook) and register its webhook;
3. show admission refusing a spec the engine could not run;
4. apply examples/atomdeployment-smollm2.yaml (SmolLM2-135M-Instruct, converted by `make model`) and wait until
   it is READY;
5. run the engine exactly as the operator's pod specs say (their command, args and rendered settings, as
   local processes: kwok's pods run nothing) and ask the model, through the openai client, a question whose
   answer anyone can check;
6. ask for a structured answer (a JSON schema), and let the model call a tool and answer from its result.

``make test`` runs this script as ``make demo`` does (tests/cluster/test_demo.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml
from atom_localcluster.__main__ import print_nodes
from atom_localcluster.cluster import Cluster, free_port
from atom_localcluster.processes import Processes, wait_http
from pydantic import BaseModel

REPO = Path(__file__).resolve().parents[1]

EXAMPLE = REPO / "examples" / "atomdeployment-smollm2.yaml"
NAME = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
QUESTION = "What is the capital of France?"
CRD = REPO / "crds" / "atomdeployments.serving.atom.dev.yaml"
BIN = Path(sys.executable).parent


class Steps:
    def __init__(self, total: int) -> None:
        self.total, self.n = total, 0

    def run(self, title: str, fn: Callable[[], object]) -> object:
        self.n += 1
        print(f"\n[{self.n}/{self.total}] {title} ...", flush=True)
        started = time.monotonic()
        try:
            result = fn()
        except Exception as e:
            said = f"\n{e.stderr.strip()}" if isinstance(e, subprocess.CalledProcessError) and e.stderr else ""
            print(f"[{self.n}/{self.total}] FAILED: {title}: {e}{said}", file=sys.stderr, flush=True)
            raise SystemExit(1) from e
        print(f"[{self.n}/{self.total}] done in {time.monotonic() - started:.1f}s", flush=True)
        return result


def start_operator(cluster: Cluster, procs: Processes) -> None:
    from atom_operator import webhook

    cluster.kubectl("apply", "--server-side", "-f", str(CRD))
    cluster.wait_crd_established("atomdeployments.serving.atom.dev")
    ca, cert, key = webhook.make_certificates(procs.workdir / "webhook", ["127.0.0.1"])
    hook_port, metrics_port = free_port(), free_port()
    proc, log = procs.start("operator", [str(BIN / "atom-operator")], {
        "KUBECONFIG": str(cluster.kubeconfig),
        "ATOM_WEBHOOK_ADDR": "127.0.0.1", "ATOM_WEBHOOK_PORT": str(hook_port),
        "ATOM_WEBHOOK_CERT": str(cert), "ATOM_WEBHOOK_KEY": str(key), "ATOM_WEBHOOK_CA": str(ca),
        "ATOM_METRICS_ADDR": "127.0.0.1", "ATOM_METRICS_PORT": str(metrics_port),
    })
    wait_http(f"http://127.0.0.1:{metrics_port}/healthz", proc, log)
    config = webhook.configuration({"url": f"https://127.0.0.1:{hook_port}", "caBundle": webhook.ca_bundle(ca)})
    cluster.apply(config)
    print(f"operator running (log: {log}); webhook registered at https://127.0.0.1:{hook_port}")


def show_refusal(cluster: Cluster) -> None:
    bad = yaml.safe_load(EXAMPLE.read_text())
    bad["metadata"]["name"] = f"{NAME}-bad"
    bad["spec"]["decode"]["kvBlocks"] = bad["spec"]["decode"]["lanes"] + 1  # the prefix cache needs lanes + 2
    out = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(bad), check=False)
    if out.returncode == 0:
        raise RuntimeError("the API server accepted a spec the engine cannot run")
    print(f"$ kubectl apply -f {NAME}-bad.yaml   (kvBlocks: {bad['spec']['decode']['kvBlocks']})\n{out.stderr.strip()}")


def apply_example(cluster: Cluster) -> None:
    print(cluster.kubectl("apply", "-f", str(EXAMPLE)).stdout.strip())
    cluster.kubectl("wait", "--for=condition=Ready", f"atomdeployment/{NAME}", "--timeout=120s", timeout=130)
    print(cluster.kubectl("get", "atomdeployments", "-o", "wide").stdout, end="")


def pod_spec(cluster: Cluster, component: str) -> tuple[list[str], str]:
    """The engine container's command and its rendered settings, as the operator wrote them."""
    deploy = cluster.get("deployments", "-l", f"app.kubernetes.io/component={component}")["items"][0]
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    volume = next(v for v in deploy["spec"]["template"]["spec"]["volumes"] if v["name"] == "config")
    data = cluster.get("configmap", volume["configMap"]["name"])["data"]
    return container["command"] + container.get("args", []), next(iter(data.values()))


@contextlib.contextmanager
def engine_as_the_pods_run_it(cluster: Cluster, procs: Processes) -> Iterator[str]:
    """Start prefill then decode locally with the pods' command and settings; yield the decode URL."""
    ports = {"prefill": free_port(), "decode": free_port()}
    kv_port = free_port()  # the prefill worker's KV transport, which decode fetches from (not its HTTP port)
    urls = {}
    for role in ("prefill", "decode"):
        argv, settings_yaml = pod_spec(cluster, role)
        settings = yaml.safe_load(settings_yaml)
        if role == "prefill":
            # The pod's fixed pdKvPort would clash with anything else on this machine that holds it.
            print(f"prefill: pdKvPort {settings.get('pdKvPort', 'default')} -> {kv_port}")
            settings["pdKvPort"] = kv_port
        if role == "decode" and settings.get("prefillWorkers"):
            # In the cluster this is the headless Service's DNS name and the KV port; here the worker is a local
            # process listening on kv_port.
            print(f"decode: prefillWorkers {settings['prefillWorkers']} -> 127.0.0.1:{kv_port}")
            settings["prefillWorkers"] = f"127.0.0.1:{kv_port}"
        config = procs.workdir / f"{role}.yaml"
        config.write_text(yaml.safe_dump(settings))
        argv = [_local(a, argv, config, ports[role]) for a in argv]
        argv[0] = str(BIN / argv[0])
        print(f"{role}: {' '.join(argv)}")
        proc, log = procs.start(role, argv + ["--host", "127.0.0.1"])
        urls[role] = f"http://127.0.0.1:{ports[role]}"
        wait_http(f"{urls[role]}/ready", proc, log)
    yield urls["decode"]


def _local(arg: str, argv: list[str], config: Path, port: int) -> str:
    i = argv.index(arg)
    if i > 0 and argv[i - 1] == "--config":
        return str(config)
    if i > 0 and argv[i - 1] == "--port":
        return str(port)
    if i > 0 and argv[i - 1] == "--metrics-port":
        return str(free_port())  # the pods' fixed metrics port would clash between two local processes
    return arg


def chat(url: str) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused")
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], max_tokens=32, temperature=0
    )
    answer = reply.choices[0].message.content
    print(f"user: {QUESTION}")
    print(f"{model}: {answer}")
    print(f"({reply.usage.prompt_tokens} prompt tokens, {reply.usage.completion_tokens} completion tokens,"
          f" finish_reason {reply.choices[0].finish_reason})")
    if "Paris" not in answer:
        raise RuntimeError(f"the model did not answer {QUESTION!r} with Paris: {answer!r}")


class Capital(BaseModel):
    """The structured answer's shape: the engine's grammar makes the reply parse as this."""

    city: str
    country: str


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def structured(url: str) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused")
    model = client.models.list().data[0].id
    reply = client.chat.completions.parse(
        model=model, messages=[{"role": "user", "content": f"{QUESTION} Answer with the city and its country."}],
        response_format=Capital, max_tokens=48, temperature=0)
    answer = reply.choices[0].message
    print(f"user: {QUESTION} (response_format: the JSON schema of {Capital.__name__})")
    print(f"{model}: {answer.content}")
    if answer.parsed is None:
        raise RuntimeError(f"the reply did not parse as {Capital.__name__}: {answer.content!r}")
    print(f"parsed: {answer.parsed!r}")


def tool_call(url: str) -> None:
    """One tool round trip: the model calls the tool, the demo runs it, the model answers from its result."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused")
    model = client.models.list().data[0].id
    messages: list[dict] = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER_TOOL],
                                           tool_choice="required", parallel_tool_calls=False, max_tokens=48,
                                           temperature=0)
    message = reply.choices[0].message
    if not message.tool_calls:
        raise RuntimeError(f"no tool call came back: {message!r}")
    call = message.tool_calls[0]
    arguments = json.loads(call.function.arguments)  # the tool grammar makes them JSON of the tool's schema
    result = {"city": arguments.get("city", ""), "temperature_c": 18, "sky": "sunny"}
    print(f"user: {messages[0]['content']} (tools: {WEATHER_TOOL['function']['name']}, tool_choice required)")
    print(f"{model} calls {call.function.name}({call.function.arguments}) -> {json.dumps(result)}")
    messages += [message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)}]
    answer = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER_TOOL],
                                            max_tokens=32, temperature=0)
    print(f"{model}: {answer.choices[0].message.content}")


def main() -> int:
    steps = Steps(9)
    workdir = Path(tempfile.mkdtemp(prefix="atom-demo-"))
    cluster = Cluster()
    procs = Processes(workdir)
    try:
        steps.run("start the control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)", cluster.start)
        steps.run("list the nodes with their NPU capacity", lambda: print_nodes(cluster))
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        steps.run("install the CRD, run the operator and register its admission webhook",
                  lambda: start_operator(cluster, procs))
        steps.run("admission refuses a spec the engine cannot run", lambda: show_refusal(cluster))
        steps.run(f"apply {EXAMPLE.relative_to(REPO)} and wait until READY", lambda: apply_example(cluster))
        stack = contextlib.ExitStack()
        url = steps.run("start prefill and decode exactly as the pod specs say",
                        lambda: stack.enter_context(engine_as_the_pods_run_it(cluster, procs)))
        with stack:
            steps.run(f"ask {NAME} {QUESTION!r} through the openai client", lambda: chat(url))
            steps.run("ask for a structured answer (a JSON schema the engine's grammar enforces)",
                      lambda: structured(url))
            steps.run("let the model call a tool, run it, and answer from its result", lambda: tool_call(url))
    finally:
        print("\n[cleanup] stopping the engine, the operator and the control plane", flush=True)
        procs.stop()
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
