#!/usr/bin/env python3
"""Renders and validates deploy/k8s/ offline (CI has no cluster and no registry).

  check_manifests.py --root REPO [--lws-crd FILE] [--k8s-version 1.30]

1. Renders every kustomization (base, overlays/cpu, overlays/gpu,
   overlays/rejoin, overlays/router, statefulset, and base +
   examples/models-hostpath.yaml) with a small
   Python renderer that knows the parts of kustomize deploy/k8s/ uses (resources,
   JSON 6902 patches, images). `kubectl kustomize` (kustomize >= v4; the
   one scripts/install-deps.sh puts in .venv, else PATH's) renders too and
   must give the same objects.
2. Validates core kinds with kubernetes-validate --strict (unknown fields
   rejected); LeaderWorkerSet objects with jsonschema against the LWS CRD's
   openAPIV3Schema (deploy/k8s/schemas/, kept in the repository) made strict (additionalProperties: false wherever the
   schema lists properties), and their pod templates again as core
   PodTemplates.
3. Lints every shardlm pod template (probes, resources, securityContext,
   /dev/shm, grace period vs drain, image tag, secrets, interface env, the
   command line against the flags the subcommands take) and the wiring
   between objects (group size = 1 + TP x PP, Services select the leader,
   the headless Service, ranks from the pod index); in overlays/router, the
   router Deployment (x2, probes, flags of `shardlm router`) in front of 2
   LWS groups: --replicas-dns names a headless Service of the leaders only,
   on their gRPC port, and the API Service selects the routers.
4. Proves each check can fail: broken copies must be rejected.

Exit 0 when all pass, 1 on a failure (a missing LWS CRD included), 77
(skipped) when a Python package or kubectl is missing: the rest still ran.
"""

import argparse
import copy
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

try:
    import jsonschema
    import kubernetes_validate
    import yaml
except ImportError as e:  # ctest SKIP_RETURN_CODE
    print(f"SKIP: {e} (scripts/install-deps.sh installs kubernetes-validate, "
          "jsonschema and pyyaml into .venv)")
    sys.exit(77)

HERE = Path(__file__).resolve().parent
LWS_GROUP_VERSION = "leaderworkerset.x-k8s.io/v1"
SHARDLM = "/opt/shardlm/bin/shardlm"
TINI = ["/usr/bin/tini", "--"]

# The flags each subcommand takes (issue #13's contract, checked against
# launch/coordinator_command.cc, cluster_serving.cc, api_flags.cc and
# worker_command.cc); anything else on a command line in deploy/k8s/ is an error.
# --device (both roles) is the GPU variant.
ALLOWED_FLAGS = {
    "coordinator": {
        "model", "tp", "pp", "listen", "http-listen", "control-listen",
        "threads", "kv-cache-bytes", "cpu-offload-bytes", "kv-cache-dtype",
        "prefix-caching", "block-size", "max-batched-tokens",
        "worker-timeout-ms", "startup-timeout-s", "step-timeout-s",
        "failure-grace-s", "drain-timeout-s", "max-client-priority",
        "max-grpc-calls", "device", "gpu-memory-utilization", "rejoin",
        "rejoin-timeout-s", "kv-checksum", "metrics-prefix-cache",
    },
    "worker": {
        "model", "coordinator", "rank", "health-listen", "join-timeout-s",
        "data-address", "data-interface", "drain-timeout-s", "device",
    },
    # launch/router_command.cc
    "router": {
        "replica", "replicas-file", "replicas-dns", "dns-interval-ms",
        "dns-wait-s", "listen", "http-listen", "policy", "model",
        "load-factor", "load-slack", "stale-after-ms", "max-grpc-calls",
        "tls-cert", "tls-key", "tls-client-ca", "replica-tls-ca",
        "replica-tls-cert", "replica-tls-key", "request-memory-mb",
        "idle-thread-timeout-s", "metrics-auth", "drain-timeout-s",
    },
}
# --listen and --http-listen default to loopback / none, --health-listen to
# none: a pod must set them.
REQUIRED_FLAGS = {
    "coordinator": {"model", "tp", "pp", "listen", "http-listen",
                    "control-listen"},
    "worker": {"model", "health-listen"},
    "router": {"listen", "http-listen", "replicas-dns"},
}
LISTEN_FLAGS = ("listen", "http-listen", "control-listen", "health-listen")
# Defaults of the binary where the manifests may leave a flag out.
DEFAULT_FLAGS = {"drain-timeout-s": "30"}
MIN_STARTUP_S = 600  # startupProbe must allow this long for model loading

# What each render must look like: kinds present, and whether GPU.
TARGETS = {
    "base": dict(path="deploy/k8s/base", lws=True, gpu=False),
    "overlays/cpu": dict(path="deploy/k8s/overlays/cpu", lws=True, gpu=False),
    "overlays/gpu": dict(path="deploy/k8s/overlays/gpu", lws=True, gpu=True),
    "overlays/rejoin": dict(path="deploy/k8s/overlays/rejoin", lws=True,
                            gpu=False, rejoin=True),
    "statefulset": dict(path="deploy/k8s/statefulset", lws=False, gpu=False),
    # Two LWS groups behind a router Deployment (issue #36).
    "overlays/router": dict(path="deploy/k8s/overlays/router", lws=True,
                            gpu=False, router=True),
}
EXAMPLE_FILES = ["deploy/k8s/examples/models-pvc.yaml",
                 "deploy/k8s/examples/model-loader.yaml"]
HOSTPATH_PATCH = "deploy/k8s/examples/models-hostpath.yaml"


class Failure(Exception):
    pass


def load_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


# ---------------------------------------------------------------- rendering

def _pointer(path):
    if path == "":
        return []
    if not path.startswith("/"):
        raise Failure(f"JSON pointer {path!r} does not start with /")
    return [p.replace("~1", "/").replace("~0", "~")
            for p in path[1:].split("/")]


def _walk(doc, parts, path):
    for p in parts:
        if isinstance(doc, list):
            if not p.isdigit() or int(p) >= len(doc):
                raise Failure(f"patch path {path}: no index {p}")
            doc = doc[int(p)]
        elif isinstance(doc, dict):
            if p not in doc:
                raise Failure(f"patch path {path}: no key {p}")
            doc = doc[p]
        else:
            raise Failure(f"patch path {path}: {p} under a scalar")
    return doc


def apply_json6902(obj, ops):
    """RFC 6902 add / remove / replace / test, as kustomize applies them."""
    if not isinstance(ops, list):
        raise Failure("a JSON 6902 patch must be a list of operations "
                      "(strategic-merge patches are not used in deploy/k8s/)")
    for op in ops:
        kind, path = op.get("op"), op.get("path", "")
        parts = _pointer(path)
        if not parts:
            raise Failure(f"patch op {kind} on the whole document")
        parent = _walk(obj, parts[:-1], path)
        last = parts[-1]
        if kind == "test":
            if _walk(obj, parts, path) != op["value"]:
                raise Failure(f"patch test failed at {path}: "
                              f"{_walk(obj, parts, path)!r} != {op['value']!r}")
        elif kind in ("add", "replace"):
            value = copy.deepcopy(op["value"])
            if isinstance(parent, list):
                if last == "-" and kind == "add":
                    parent.append(value)
                elif last.isdigit() and int(last) <= len(parent) - (kind == "replace"):
                    if kind == "add":
                        parent.insert(int(last), value)
                    else:
                        parent[int(last)] = value
                else:
                    raise Failure(f"patch {kind} {path}: bad index {last}")
            else:
                if kind == "replace" and last not in parent:
                    raise Failure(f"patch replace {path}: no key {last}")
                parent[last] = value
        elif kind == "remove":
            _walk(obj, parts, path)
            del parent[int(last) if isinstance(parent, list) else last]
        else:
            raise Failure(f"patch op {kind!r} is not supported here")


def _matches(obj, target):
    api = obj.get("apiVersion", "")
    group, _, version = api.rpartition("/")
    return ((target.get("kind") in (None, obj.get("kind"))) and
            (target.get("name") in (None, obj["metadata"].get("name"))) and
            (target.get("group") in (None, group)) and
            (target.get("version") in (None, version)))


def _set_images(obj, images):
    def visit(node):
        if isinstance(node, dict):
            for key in ("containers", "initContainers"):
                for c in node.get(key, []) or []:
                    name, _, tag = c.get("image", "").partition(":")
                    for im in images:
                        if im["name"] == name:
                            c["image"] = (im.get("newName", name) + ":" +
                                          im.get("newTag", tag))
            for v in node.values():
                visit(v)
        elif isinstance(node, list):
            for v in node:
                visit(v)
    visit(obj)


def render_python(directory):
    """The subset of kustomize that deploy/k8s/ uses; anything else is an error."""
    directory = Path(directory)
    k = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(k) - {"apiVersion", "kind", "resources", "patches", "images"}
    if unknown:
        raise Failure(f"{directory}/kustomization.yaml uses {sorted(unknown)}, "
                      "which this renderer does not implement")
    objs = []
    for r in k.get("resources", []):
        p = (directory / r).resolve()
        objs += render_python(p) if p.is_dir() else load_docs(p)
    for patch in k.get("patches", []):
        ops = (load_docs(directory / patch["path"])[0] if "path" in patch
               else yaml.safe_load(patch["patch"]))
        hit = [o for o in objs if _matches(o, patch.get("target", {}))]
        if not hit:
            raise Failure(f"{directory}: patch {patch} matches no object")
        for o in hit:
            apply_json6902(o, ops)
    if k.get("images"):
        for o in objs:
            _set_images(o, k["images"])
    return objs


def kubectl_kustomize():
    """`kubectl` when its kustomize can render deploy/k8s/, else (None, reason)."""
    venv = Path(sys.executable).parent / "kubectl"
    kubectl = str(venv) if venv.is_file() else shutil.which("kubectl")
    if not kubectl:
        return None, "no kubectl in .venv or on PATH"
    try:
        out = subprocess.run([kubectl, "version", "--client", "-o", "json"],
                             capture_output=True, text=True, timeout=30)
        version = json.loads(out.stdout).get("kustomizeVersion", "")
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        return None, f"kubectl version failed: {e}"
    m = re.match(r"v(\d+)\.", version)
    if not m or int(m.group(1)) < 4:
        return None, (f"kubectl at {kubectl} embeds kustomize "
                      f"{version or '< v4 (kubectl < 1.21)'}, too old for "
                      "`patches:`")
    return kubectl, f"kubectl at {kubectl}, kustomize {version}"


def render_kubectl(kubectl, directory):
    out = subprocess.run([kubectl, "kustomize", str(directory)],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise Failure(f"kubectl kustomize {directory} failed:\n{out.stderr}")
    return [d for d in yaml.safe_load_all(out.stdout) if d is not None]


def _key(o):
    return (o["kind"], o["metadata"]["name"])


# --------------------------------------------------------------- validation

def strict_crd_schema(schema):
    """The CRD's structural schema with unknown fields rejected."""
    schema = copy.deepcopy(schema)

    def visit(s):
        if not isinstance(s, dict):
            return
        if ("properties" in s and "additionalProperties" not in s and
                not s.get("x-kubernetes-preserve-unknown-fields")):
            s["additionalProperties"] = False
        for p in s.get("properties", {}).values():
            visit(p)
        for key in ("items", "additionalProperties", "not"):
            visit(s.get(key))
        for key in ("allOf", "anyOf", "oneOf"):
            for sub in s.get(key, []):
                visit(sub)
    visit(schema)
    # ObjectMeta is `type: object` in a CRD; hold it to the fields we use.
    schema["properties"]["metadata"] = {
        "type": "object", "additionalProperties": False,
        "required": ["name"],
        "properties": {
            "name": {"type": "string"}, "namespace": {"type": "string"},
            "labels": {"type": "object",
                       "additionalProperties": {"type": "string"}},
            "annotations": {"type": "object",
                            "additionalProperties": {"type": "string"}}}}
    return schema


LWS_CRD = "deploy/k8s/schemas/leaderworkerset-crd.yaml"


def find_lws_schema(root, explicit):
    """(schema, description): the LWS CRD's v1 schema, from --lws-crd,
    $SHARDLM_LWS_CRD, else the copy in the repository (LWS_CRD)."""
    path = Path(explicit or os.environ.get("SHARDLM_LWS_CRD", "")
                or root / LWS_CRD)
    if not path.is_file():
        raise Failure(f"the LWS CRD {path}: no such file")
    crd = load_docs(path)[0]
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return (strict_crd_schema(version["schema"]["openAPIV3Schema"]),
            f"LWS CRD {path}")


class Validator:
    def __init__(self, k8s_version, lws_schema):
        self.k8s_version = k8s_version
        self.lws = jsonschema.Draft7Validator(lws_schema)

    def core(self, obj, what):
        try:
            kubernetes_validate.validate(obj, self.k8s_version, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = "/".join(str(p) for p in e.path)
            return [f"{what}: {where}: {e.message}"]
        except kubernetes_validate.SchemaNotFoundError as e:
            return [f"{what}: {e.message}"]
        return []

    def validate(self, obj):
        what = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        if obj.get("kind") != "LeaderWorkerSet":
            return self.core(obj, what)
        if obj.get("apiVersion") != LWS_GROUP_VERSION:
            return [f"{what}: apiVersion {obj.get('apiVersion')}"]
        errors = [f"{what}: {'/'.join(str(p) for p in e.path)}: {e.message}"
                  for e in self.lws.iter_errors(obj)]
        lwt = obj.get("spec", {}).get("leaderWorkerTemplate", {})
        for key in ("leaderTemplate", "workerTemplate"):
            if key in lwt:
                wrapped = {"apiVersion": "v1", "kind": "PodTemplate",
                           "metadata": {"name": f"{what}-{key}"},
                           "template": lwt[key]}
                errors += self.core(wrapped, f"{what} {key} as PodTemplate")
        return errors


# --------------------------------------------------------------------- lint

def parse_flags(argv, where):
    """--name=value or --name value -> {name: value}; errors for the rest."""
    flags, errors, i = {}, [], 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("--"):
            errors.append(f"{where}: argument {a!r} is not a --flag")
            i += 1
            continue
        name, eq, value = a[2:].partition("=")
        if not eq:
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value, i = argv[i + 1], i + 1
            else:
                value = "true"
        if name in flags:
            errors.append(f"{where}: --{name} given twice")
        flags[name] = value
        i += 1
    return flags, errors


def _port(addr):
    try:
        return int(addr.rpartition(":")[2])
    except ValueError:
        return -1


def _probe_port(probe, container):
    port = probe["httpGet"]["port"]
    if isinstance(port, int):
        return port
    for p in container.get("ports", []):
        if p.get("name") == port:
            return p["containerPort"]
    return None


def lint_pod_template(tmpl, where, gpu):
    """Returns (errors, info) for one shardlm pod template."""
    e = []
    spec = tmpl.get("spec", {})
    labels = tmpl.get("metadata", {}).get("labels", {})
    containers = spec.get("containers", [])
    if len(containers) != 1:
        return [f"{where}: expected one container, got {len(containers)}"], {}
    c = containers[0]
    w = f"{where} container {c.get('name')}"

    # Command line.
    argv = list(c.get("command", [])) + list(c.get("args", []))
    if argv[:2] == TINI:
        argv = argv[2:]
    role = argv[1] if len(argv) > 1 and argv[0] == SHARDLM else None
    if role not in ALLOWED_FLAGS:
        return [f"{w}: command {argv[:2]} is not "
                f"`{SHARDLM} coordinator|worker|router`"], {}
    flags, fe = parse_flags(argv[2:], w)
    e += fe
    for f in sorted(set(flags) - ALLOWED_FLAGS[role]):
        e.append(f"{w}: --{f} is not a flag of `shardlm {role}`")
    for f in sorted(REQUIRED_FLAGS[role] - set(flags) - set(DEFAULT_FLAGS)):
        e.append(f"{w}: --{f} is missing")
    if labels.get("app.kubernetes.io/component") != role:
        e.append(f"{w}: label app.kubernetes.io/component is "
                 f"{labels.get('app.kubernetes.io/component')!r}, not {role}")
    get = lambda f: flags.get(f, DEFAULT_FLAGS.get(f))  # noqa: E731
    for f in LISTEN_FLAGS:
        host = flags.get(f, "0.0.0.0:0").rpartition(":")[0]
        if host == "localhost" or host.startswith("127.") or host == "[::1]":
            e.append(f"{w}: --{f}={flags[f]} is not reachable from other pods")

    # Image.
    image = c.get("image", "")
    last = image.split("/")[-1]  # a registry host may carry a :port
    tag = last.partition("@")[0].partition(":")[2]
    if "@sha256:" not in image and (not tag or tag == "latest"):
        e.append(f"{w}: image {image!r} needs a pinned tag, not latest/none")

    # Probes: startup covers loading, liveness /health, readiness /ready.
    ports = {p["containerPort"] for p in c.get("ports", [])}
    health_port = (_port(get("http-listen")) if role in ("coordinator",
                                                           "router")
                   else _port(get("health-listen")))
    for kind, path in (("startupProbe", "/health"), ("livenessProbe", "/health"),
                       ("readinessProbe", "/ready")):
        p = c.get(kind)
        if not p or "httpGet" not in p:
            e.append(f"{w}: no {kind} (httpGet {path})")
            continue
        if p["httpGet"].get("path") != path:
            e.append(f"{w}: {kind} path {p['httpGet'].get('path')} is not {path}")
        if _probe_port(p, c) != health_port:
            e.append(f"{w}: {kind} port {p['httpGet']['port']} is not the "
                     f"health port {health_port}")
    sp = c.get("startupProbe") or {}
    if sp and sp.get("failureThreshold", 3) * sp.get("periodSeconds", 10) < MIN_STARTUP_S:
        e.append(f"{w}: startupProbe allows "
                 f"{sp.get('failureThreshold', 3) * sp.get('periodSeconds', 10)} s "
                 f"< {MIN_STARTUP_S} s for loading")
    if health_port not in ports:
        e.append(f"{w}: health port {health_port} is not a containerPort")
    if role in ("coordinator", "router"):
        for f in ("listen", "http-listen", "control-listen"):
            if f in flags and _port(flags[f]) not in ports:
                e.append(f"{w}: --{f} port is not a containerPort")

    # Resources.
    res = c.get("resources", {})
    for part in ("requests", "limits"):
        for r in ("cpu", "memory"):
            if r not in res.get(part, {}):
                e.append(f"{w}: no resources.{part}.{r}")
    has_gpu = "nvidia.com/gpu" in res.get("limits", {})
    if gpu and role == "worker":
        if not has_gpu:
            e.append(f"{w}: GPU worker without limits nvidia.com/gpu")
        if get("device") != "cuda":
            e.append(f"{w}: GPU worker without --device=cuda")
    elif gpu and role == "coordinator":
        # It holds no weights, but refuses workers of another device kind.
        if has_gpu:
            e.append(f"{w}: the coordinator asks for a GPU it does not use")
        if get("device") != "cuda":
            e.append(f"{w}: coordinator of GPU workers without --device=cuda")
    elif has_gpu or "device" in flags:
        e.append(f"{w}: CPU render asks for a GPU or sets --device")

    # Security.
    psc, csc = spec.get("securityContext", {}), c.get("securityContext", {})
    if not (psc.get("runAsNonRoot") or csc.get("runAsNonRoot")):
        e.append(f"{w}: runAsNonRoot is not true")
    uid = csc.get("runAsUser", psc.get("runAsUser"))
    if not uid:
        e.append(f"{w}: runAsUser is not a non-zero uid")
    if csc.get("allowPrivilegeEscalation") is not False:
        e.append(f"{w}: allowPrivilegeEscalation is not false")
    if csc.get("readOnlyRootFilesystem") is not True:
        e.append(f"{w}: readOnlyRootFilesystem is not true")
    if "ALL" not in csc.get("capabilities", {}).get("drop", []):
        e.append(f"{w}: capabilities do not drop ALL")
    if csc.get("capabilities", {}).get("add"):
        e.append(f"{w}: capabilities added")
    if csc.get("privileged"):
        e.append(f"{w}: privileged")
    seccomp = (csc.get("seccompProfile") or psc.get("seccompProfile") or {})
    if seccomp.get("type") != "RuntimeDefault":
        e.append(f"{w}: seccompProfile is not RuntimeDefault")

    # Volumes: memory-backed /dev/shm with a limit; the model read-only.
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
    shm = volumes.get(mounts.get("/dev/shm", {}).get("name"), {})
    if role != "router" and (
            shm.get("emptyDir", {}).get("medium") != "Memory" or
            not shm.get("emptyDir", {}).get("sizeLimit")):
        e.append(f"{w}: /dev/shm is not an emptyDir medium Memory with sizeLimit")
    model = get("model") or ""
    mm = [m for p, m in mounts.items() if model.startswith(p.rstrip("/") + "/")]
    if not mm:
        e.append(f"{w}: --model {model} is not on a mounted volume")
    elif not mm[0].get("readOnly"):
        e.append(f"{w}: the model volume is not mounted readOnly")
    elif not ({"persistentVolumeClaim", "hostPath"} &
              set(volumes.get(mm[0]["name"], {}))):
        e.append(f"{w}: the model volume is neither a PVC nor a hostPath")

    # Grace period covers the drain.
    drain = int(get("drain-timeout-s"))
    grace = spec.get("terminationGracePeriodSeconds", 30)
    if grace < drain + 5:
        e.append(f"{w}: terminationGracePeriodSeconds {grace} < drain "
                 f"{drain} + 5")

    # Environment: secrets from a Secret, interfaces named.
    env = {v["name"]: v for v in c.get("env", [])}
    for name, required in (("SHARDLM_CLUSTER_TOKEN", role != "router"),
                           ("SHARDLM_API_KEY", False)):
        v = env.get(name)
        if v is None:
            if required:
                e.append(f"{w}: no {name}")
        elif "value" in v or "secretKeyRef" not in v.get("valueFrom", {}):
            e.append(f"{w}: {name} is not from a secretKeyRef")
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if role != "router" and not env.get(name, {}).get("value"):
            e.append(f"{w}: {name} is not set")
    return e, dict(role=role, flags=flags, env=env, labels=labels)


def _selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def lint_routers(objs, by_kind, templates):
    """Lints the router Deployment and its wiring to the LWS leaders;
    appends its pod template to `templates`. Returns (errors, summary)."""
    e, done = [], []
    deps = by_kind.get("Deployment", [])
    if len(deps) != 1:
        return [f"expected one router Deployment, got {len(deps)}"], done
    d = deps[0]
    name = d["metadata"]["name"]
    t = d["spec"]["template"]
    if not _selects(d["spec"]["selector"].get("matchLabels"),
                    t["metadata"].get("labels", {})):
        e.append(f"Deployment {name}: selector does not match its pods")
    if d["spec"].get("replicas", 1) < 2:
        e.append(f"Deployment {name}: {d['spec'].get('replicas', 1)} router; "
                 "run at least 2 (any router can take any request)")
    te, info = lint_pod_template(t, f"Deployment {name}", False)
    e += te
    if info.get("role") != "router":
        return e + [f"Deployment {name} must run `shardlm router`"], done
    templates.append((name, t, info))
    lwss = by_kind.get("LeaderWorkerSet", [])
    if len(lwss) != 1 or lwss[0]["spec"].get("replicas") != 2:
        e.append("the router overlay must run one LeaderWorkerSet with "
                 "replicas: 2")
    host, _, port = info["flags"].get("replicas-dns", "").rpartition(":")
    headless = [s for s in by_kind.get("Service", [])
                if s["spec"].get("clusterIP") == "None"]
    target = [s for s in headless
              if host.split(".")[0] == s["metadata"]["name"]]
    if not target:
        e.append(f"--replicas-dns host {host!r} is no headless Service "
                 f"here ({[s['metadata']['name'] for s in headless]})")
        return e, done
    h = target[0]
    lwt = lwss[0]["spec"]["leaderWorkerTemplate"] if lwss else {}
    for key, role in (("leaderTemplate", True), ("workerTemplate", False)):
        labels = lwt.get(key, {}).get("metadata", {}).get("labels", {})
        if _selects(h["spec"].get("selector"), labels) != role:
            e.append(f"headless Service {h['metadata']['name']} "
                     f"{'misses' if role else 'selects'} the {key} pods")
    if _selects(h["spec"].get("selector"), t["metadata"].get("labels", {})):
        e.append(f"headless Service {h['metadata']['name']} selects routers")
    ports = {p["port"] for p in h["spec"].get("ports", [])}
    if not port.isdigit() or int(port) not in ports:
        e.append(f"--replicas-dns port {port} is not a port of "
                 f"{h['metadata']['name']} ({sorted(ports)})")
    leader_args = lwt.get("leaderTemplate", {}).get("spec", {}).get(
        "containers", [{}])[0].get("args", [])
    if (info["flags"].get("policy", "kv") == "kv" and
            "--metrics-prefix-cache" not in leader_args):
        e.append("kv routing, but the leaders lack --metrics-prefix-cache "
                 "(the router would see no cached prefix)")
    done.append(f"Deployment {name} x{d['spec'].get('replicas', 1)} "
                f"(--replicas-dns {info['flags'].get('replicas-dns')}) in "
                f"front of LWS replicas "
                f"{lwss[0]['spec'].get('replicas') if lwss else '?'}")
    return e, done


def lint_render(objs, target):
    """Lints one rendered target; returns (errors, summary lines)."""
    e, done = [], []
    by_kind = {}
    for o in objs:
        by_kind.setdefault(o["kind"], []).append(o)
    templates = []  # (where, template, info)

    if target["lws"]:
        lwss = by_kind.get("LeaderWorkerSet", [])
        if len(lwss) != 1:
            return [f"expected one LeaderWorkerSet, got {len(lwss)}"], done
        lws = lwss[0]
        lwt = lws["spec"].get("leaderWorkerTemplate", {})
        # A coordinator with --rejoin re-forms the group itself: only the
        # failed pod may restart. Without it, the whole group must.
        leader_args = lwt.get("leaderTemplate", {}).get("spec", {}).get(
            "containers", [{}])[0].get("args", [])
        rejoin = "--rejoin" in leader_args
        want = "None" if rejoin else "RecreateGroupOnPodRestart"
        if lwt.get("restartPolicy") != want:
            e.append(f"LWS restartPolicy is not {want} (the coordinator "
                     f"{'has' if rejoin else 'lacks'} --rejoin)")
        if rejoin != target.get("rejoin", False):
            e.append(f"coordinator --rejoin {'set' if rejoin else 'missing'} "
                     f"in this target")
        if lws["spec"].get("startupPolicy", "LeaderCreated") != "LeaderCreated":
            e.append("LWS startupPolicy must be LeaderCreated (the leader is "
                     "ready only after the workers join it)")
        if "leaderTemplate" not in lwt or "workerTemplate" not in lwt:
            e.append("LWS lacks a separate leaderTemplate and workerTemplate")
            return e, done
        infos = {}
        for key in ("leaderTemplate", "workerTemplate"):
            te, info = lint_pod_template(lwt[key], f"LWS {key}", target["gpu"])
            e += te
            infos[key] = info
            templates.append((key, lwt[key], info))
        lead, work = infos["leaderTemplate"], infos["workerTemplate"]
        if lead.get("role") != "coordinator" or work.get("role") != "worker":
            e.append("LWS leader must run coordinator, workers worker")
        else:
            ranks = int(lead["flags"]["tp"]) * int(lead["flags"]["pp"])
            if lwt.get("size") != 1 + ranks:
                e.append(f"LWS size {lwt.get('size')} != 1 + tp x pp = {1 + ranks}")
            if "rank" in work["flags"] or "coordinator" in work["flags"]:
                e.append("LWS workers must take --rank and --coordinator "
                         "from LWS_WORKER_INDEX / LWS_LEADER_ADDRESS")
            if _port(lead["flags"]["control-listen"]) != 50052:
                e.append("the coordinator's control port must be 50052, where "
                         "workers look by default")
            done.append(f"LWS size {lwt['size']} = 1 + TP {lead['flags']['tp']}"
                        f" x PP {lead['flags']['pp']}, "
                        f"{lwt['restartPolicy']}, {lws['spec'].get('startupPolicy')}")
    else:
        sts = {o["metadata"]["name"]: o for o in by_kind.get("StatefulSet", [])}
        leader, workers = sts.get("shardlm-leader"), sts.get("shardlm-worker")
        if not leader or not workers:
            return [f"expected StatefulSets shardlm-leader and shardlm-worker, "
                    f"got {sorted(sts)}"], done
        infos = {}
        for name, s in sts.items():
            t = s["spec"]["template"]
            if not _selects(s["spec"]["selector"].get("matchLabels"),
                            t["metadata"].get("labels", {})):
                e.append(f"StatefulSet {name}: selector does not match its pods")
            te, info = lint_pod_template(t, f"StatefulSet {name}", target["gpu"])
            e += te
            infos[name] = info
            templates.append((name, t, info))
        lead, work = infos["shardlm-leader"], infos["shardlm-worker"]
        if lead.get("role") != "coordinator" or work.get("role") != "worker":
            return e + ["shardlm-leader must run coordinator, "
                        "shardlm-worker worker"], done
        if leader["spec"].get("replicas") != 1:
            e.append("the leader StatefulSet must have 1 replica")
        ranks = int(lead["flags"]["tp"]) * int(lead["flags"]["pp"])
        if workers["spec"].get("replicas") != ranks:
            e.append(f"workers replicas {workers['spec'].get('replicas')} != "
                     f"tp x pp = {ranks}")
        if workers["spec"].get("podManagementPolicy") != "Parallel":
            e.append("workers podManagementPolicy is not Parallel")
        headless = [s for s in by_kind.get("Service", [])
                    if s["spec"].get("clusterIP") == "None"]
        if len(headless) != 1:
            e.append("expected one headless Service (clusterIP: None)")
        else:
            h = headless[0]
            hname = h["metadata"]["name"]
            if h["spec"].get("publishNotReadyAddresses") is not True:
                e.append("headless Service lacks publishNotReadyAddresses: true")
            for name, s in sts.items():
                if s["spec"].get("serviceName") != hname:
                    e.append(f"StatefulSet {name} serviceName is not {hname}")
                if not _selects(h["spec"].get("selector"),
                                s["spec"]["template"]["metadata"]["labels"]):
                    e.append(f"headless Service does not select {name}'s pods")
            want = (f"shardlm-leader-0.{hname}:"
                    f"{_port(lead['flags']['control-listen'])}")
            if work["flags"].get("coordinator") != want:
                e.append(f"workers --coordinator is "
                         f"{work['flags'].get('coordinator')}, not {want}")
        idx = work["env"].get("SHARDLM_POD_INDEX", {}).get("valueFrom", {})
        if idx.get("fieldRef", {}).get("fieldPath") != \
                "metadata.labels['apps.kubernetes.io/pod-index']":
            e.append("workers lack SHARDLM_POD_INDEX from the pod-index label")
        if "rank" in work["flags"]:
            e.append("StatefulSet workers must take the rank from the pod index")
        done.append(f"StatefulSets: leader x1, workers x{ranks} Parallel, "
                    "headless Service publishNotReadyAddresses, rank from "
                    "apps.kubernetes.io/pod-index")

    # Routers (overlays/router): a Deployment of at least 2 in front of 2
    # LWS groups, finding the leaders through a headless Service.
    deployments = by_kind.get("Deployment", [])
    if target.get("router"):
        re_, rdone = lint_routers(objs, by_kind, templates)
        e += re_
        done += rdone
    elif deployments:
        e.append(f"unexpected Deployments here: "
                 f"{[d['metadata']['name'] for d in deployments]}")
    front = "router" if target.get("router") else "coordinator"

    # The API Service: selects leaders (or the routers in front of them)
    # only, exposes gRPC and HTTP.
    api = [s for s in by_kind.get("Service", [])
           if s["spec"].get("clusterIP") != "None"]
    if len(api) != 1:
        e.append(f"expected one API Service, got {len(api)}")
    else:
        s = api[0]
        for where, t, info in templates:
            sel = _selects(s["spec"].get("selector"),
                           t["metadata"].get("labels", {}))
            if sel != (info.get("role") == front):
                e.append(f"API Service {'selects' if sel else 'misses'} "
                         f"{where} pods")
        got = {p["port"] for p in s["spec"].get("ports", [])}
        if not {50051, 8000} <= got:
            e.append(f"API Service ports {sorted(got)} lack 50051 and 8000")
        done.append(f"API Service on the {front}s: " + ", ".join(
            f"{p['name']} {p['port']}" for p in s["spec"]["ports"]))
    done.append(f"{len(templates)} pod templates linted"
                + (" (GPU: nvidia.com/gpu, --device=cuda)" if target["gpu"] else ""))
    return e, done


# ----------------------------------------------------------------- the run

def check_target(name, objs, target, validator):
    errors = []
    for o in objs:
        errors += validator.validate(o)
    le, done = lint_render(objs, target)
    return errors + le, done


def negative_tests(renders, validator):
    """Each broken copy must be rejected; returns failures of this test."""
    base = renders["base"]

    def lws(objs):
        return next(o for o in objs if o["kind"] == "LeaderWorkerSet")

    def lt(objs, key="leaderTemplate"):
        return lws(objs)["spec"]["leaderWorkerTemplate"][key]["spec"]

    def worker_sts(objs):
        return next(o for o in objs if o["metadata"]["name"] == "shardlm-worker")

    def headless(objs):
        return next(o for o in objs if o["kind"] == "Service"
                    and o["spec"].get("clusterIP") == "None")

    def router(objs):
        return next(o for o in objs if o["kind"] == "Deployment")

    def router_c(objs):
        return router(objs)["spec"]["template"]["spec"]["containers"][0]

    def api_service(objs):
        return next(o for o in objs if o["kind"] == "Service"
                    and o["spec"].get("clusterIP") != "None")

    cases = [
        ("leader readinessProbe removed", "base",
         lambda o: lt(o)["containers"][0].pop("readinessProbe")),
        ("worker startupProbe removed", "base",
         lambda o: lt(o, "workerTemplate")["containers"][0].pop("startupProbe")),
        ("unknown field in the LWS spec", "base",
         lambda o: lws(o)["spec"]["leaderWorkerTemplate"].update(sizee=5)),
        ("restartPolicy misspelt", "base",
         lambda o: lws(o)["spec"]["leaderWorkerTemplate"].update(
             restartPolicy="RecreateGroupOnRestart")),
        ("unknown field in a leader container", "base",
         lambda o: lt(o)["containers"][0].update(livenesProbe={})),
        ("unknown field in a Service", "base",
         lambda o: next(x for x in o if x["kind"] == "Service")["spec"].update(
             selectors={})),
        ("image tag latest", "base",
         lambda o: lt(o)["containers"][0].update(image="shardlm:latest")),
        ("flag the coordinator lacks", "base",
         lambda o: lt(o)["containers"][0]["args"].append("--bogus=1")),
        ("cluster token as a plain value", "base",
         lambda o: lt(o, "workerTemplate")["containers"][0]["env"].__setitem__(
             0, {"name": "SHARDLM_CLUSTER_TOKEN", "value": "x"})),
        ("coordinator API on loopback", "base",
         lambda o: lt(o)["containers"][0]["args"].__setitem__(
             3, "--listen=127.0.0.1:50051")),
        ("no memory limit", "base",
         lambda o: lt(o)["containers"][0]["resources"]["limits"].pop("memory")),
        ("root filesystem writable", "base",
         lambda o: lt(o, "workerTemplate")["containers"][0][
             "securityContext"].update(readOnlyRootFilesystem=False)),
        ("grace period shorter than the drain", "base",
         lambda o: lt(o).update(terminationGracePeriodSeconds=20)),
        ("/dev/shm not memory-backed", "base",
         lambda o: lt(o)["volumes"][1]["emptyDir"].pop("medium")),
        ("size not 1 + tp x pp", "base",
         lambda o: lws(o)["spec"]["leaderWorkerTemplate"].update(size=4)),
        ("startupPolicy LeaderReady", "base",
         lambda o: lws(o)["spec"].update(startupPolicy="LeaderReady")),
        ("--rejoin with RecreateGroupOnPodRestart", "overlays/rejoin",
         lambda o: lws(o)["spec"]["leaderWorkerTemplate"].update(
             restartPolicy="RecreateGroupOnPodRestart")),
        ("restartPolicy None without --rejoin", "base",
         lambda o: lws(o)["spec"]["leaderWorkerTemplate"].update(
             restartPolicy="None")),
        ("GPU overlay without nvidia.com/gpu", "overlays/gpu",
         lambda o: lt(o, "workerTemplate")["containers"][0]["resources"][
             "limits"].pop("nvidia.com/gpu")),
        ("headless Service without publishNotReadyAddresses", "statefulset",
         lambda o: headless(o)["spec"].pop("publishNotReadyAddresses")),
        ("workers OrderedReady", "statefulset",
         lambda o: worker_sts(o)["spec"].update(
             podManagementPolicy="OrderedReady")),
        ("router readinessProbe removed", "overlays/router",
         lambda o: router_c(o).pop("readinessProbe")),
        ("router livenessProbe on /ready", "overlays/router",
         lambda o: router_c(o)["livenessProbe"]["httpGet"].update(
             path="/ready")),
        ("a flag the router lacks", "overlays/router",
         lambda o: router_c(o)["args"].append("--tp=2")),
        ("one router", "overlays/router",
         lambda o: router(o)["spec"].update(replicas=1)),
        ("one LWS group behind the routers", "overlays/router",
         lambda o: lws(o)["spec"].update(replicas=1)),
        ("--replicas-dns naming another Service", "overlays/router",
         lambda o: router_c(o)["args"].__setitem__(
             0, "--replicas-dns=shardlm:50051")),
        ("--replicas-dns on the control port", "overlays/router",
         lambda o: router_c(o)["args"].__setitem__(
             0, "--replicas-dns=shardlm-leaders:50052")),
        ("leaders Service selecting workers too", "overlays/router",
         lambda o: headless(o)["spec"]["selector"].pop(
             "app.kubernetes.io/component")),
        ("API Service still on the leaders", "overlays/router",
         lambda o: api_service(o)["spec"]["selector"].update(
             {"app.kubernetes.io/component": "coordinator"})),
        ("kv routing without --metrics-prefix-cache", "overlays/router",
         lambda o: lt(o)["containers"][0]["args"].remove(
             "--metrics-prefix-cache")),
        ("workers without the pod index", "statefulset",
         lambda o: worker_sts(o)["spec"]["template"]["spec"]["containers"][0][
             "env"].pop(0)),
    ]
    failures = []
    for what, name, mutate in cases:
        objs = copy.deepcopy(renders[name])
        mutate(objs)
        errors, _ = check_target(name, objs, TARGETS[name], validator)
        if errors:
            print(f"  rejected as it should be: {what} ({errors[0]})")
        else:
            failures.append(f"negative test not rejected: {what}")
    # And the renderer's own patch test op.
    try:
        apply_json6902(copy.deepcopy(lws(base)), [
            {"op": "test", "path": "/spec/replicas", "value": 7}])
        failures.append("negative test not rejected: failing patch test op")
    except Failure:
        print("  rejected as it should be: a failing JSON 6902 test op")
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=str(HERE.parent.parent))
    ap.add_argument("--lws-crd", help="the LWS CRD YAML (default: "
                    f"$SHARDLM_LWS_CRD, else {LWS_CRD})")
    ap.add_argument("--k8s-version", default="1.30",
                    help="Kubernetes schema version for kubernetes-validate")
    args = ap.parse_args()
    root = Path(args.root).resolve()
    t0 = time.monotonic()
    failures = []

    try:
        schema, schema_note = find_lws_schema(root, args.lws_crd)
    except Failure as e:
        print(f"FAIL: {e}")
        return 1
    validator = Validator(args.k8s_version, schema)
    print(f"kubernetes-validate {kubernetes_validate.__version__}, strict, "
          f"Kubernetes {args.k8s_version} schemas; jsonschema "
          f"{importlib.metadata.version('jsonschema')}")
    print(f"LeaderWorkerSet schema: {schema_note}")
    kubectl, kubectl_note = kubectl_kustomize()
    print(f"rendering: Python renderer; kubectl kustomize: "
          f"{'yes, ' + kubectl_note if kubectl else 'no, ' + kubectl_note}")

    renders = {}
    for name, target in TARGETS.items():
        try:
            objs = render_python(root / target["path"])
            if kubectl:
                ko = render_kubectl(kubectl, root / target["path"])
                if sorted(ko, key=_key) != sorted(objs, key=_key):
                    raise Failure(f"{name}: kubectl kustomize and the Python "
                                  "renderer disagree")
        except Failure as e:
            failures.append(str(e))
            print(f"FAIL {name}: {e}")
            continue
        renders[name] = objs
        errors, done = check_target(name, objs, target, validator)
        kinds = ", ".join(f"{o['kind']}/{o['metadata']['name']}" for o in objs)
        print(f"{'ok  ' if not errors else 'FAIL'} {name}: {kinds}"
              f"{' (kubectl render identical)' if kubectl else ''}")
        for d in done:
            print(f"       {d}")
        for err in errors:
            print(f"       {err}")
        failures += [f"{name}: {err}" for err in errors]

    # The hostPath example patch on the base; the other examples as files.
    if "base" in renders:
        objs = copy.deepcopy(renders["base"])
        try:
            ops = load_docs(root / HOSTPATH_PATCH)[0]
            for o in objs:
                if o["kind"] == "LeaderWorkerSet":
                    apply_json6902(o, ops)
            errors, _ = check_target("base+hostpath", objs, TARGETS["base"],
                                     validator)
        except Failure as e:
            errors = [str(e)]
        print(f"{'ok  ' if not errors else 'FAIL'} base + {HOSTPATH_PATCH}")
        failures += [f"hostpath: {err}" for err in errors]
    for f in EXAMPLE_FILES:
        errors = []
        for o in load_docs(root / f):
            errors += validator.validate(o)
        print(f"{'ok  ' if not errors else 'FAIL'} {f}")
        failures += [f"{f}: {err}" for err in errors]

    if len(renders) == len(TARGETS):
        print("negative self-test (broken copies must be rejected):")
        failures += negative_tests(renders, validator)

    elapsed = time.monotonic() - t0
    if failures:
        print(f"FAIL ({len(failures)} problems, {elapsed:.1f} s):")
        for f in failures:
            print(f"  {f}")
        return 1
    if not kubectl:
        print(f"SKIP: no failure, but kubectl kustomize did not cross-check "
              f"the Python renderer: {kubectl_note} (scripts/install-deps.sh "
              f"installs one into .venv) ({elapsed:.1f} s)")
        return 77
    print(f"PASS ({elapsed:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
