"""The test cluster of real nodes (scripts/test-cluster.sh: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and nodes of a kubelet and containerd each, running the
worker image that scripts/images.sh builds) as the operator's end-to-end scenarios share it: one
cluster brought up by `setup`, used by each scenario in turn (a process each, one ctest each) and
removed by `cleanup`. What the processes share lives in one directory, whose path the state file
names; the controllers run on this machine, serving the rendezvous on the nodes' bridge, and outlive
the scenario that started them (their pids are in the directory).

The helpers speak kubectl as a user would. Every wait is bounded; a failed check raises Failure,
whose message the scenario prints with what the cluster shows (controller logs, pods, their logs).
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

JOB = "cosmoflow-k8s"  # the example's name, in every scenario's own namespace


class Failure(AssertionError):
    pass


class Cluster:
    def __init__(self, bin_dir, src, state_file):
        self.bin = bin_dir
        self.src = src
        self.state_file = state_file
        with open(state_file) as f:
            state = json.load(f)
        self.dir = state["dir"]
        self.rendezvous = "%s:%d" % (state["rendezvous_host"], state["rendezvous_port"])
        self.kubeconfig = os.path.join(self.dir, "cluster", "kubeconfig")
        self.key = ["--token-key-file", os.path.join(self.dir, "token.key")]
        os.environ["KUBECONFIG"] = self.kubeconfig

    # -- bringing it up and down

    @staticmethod
    def create(bin_dir, src, state_file, nodes=4, gpus=2, zones=2):
        """Builds the images, starts the cluster and writes the state file; returns the Cluster.
        The CRD is not applied: the caller checks the controller's start-up errors first."""
        if os.path.exists(state_file):
            Cluster.destroy(src, state_file)  # what a run that was killed left
        d = tempfile.mkdtemp(prefix="tessera-kube-")
        os.chmod(d, 0o755)  # the worker (uid 65532) reaches its hostPath volumes through it
        with open(state_file, "w") as f:
            json.dump({"dir": d, "rendezvous_host": "", "rendezvous_port": 0}, f)
        script(src, "images.sh", "build", "--binaries", bin_dir)
        t0 = time.monotonic()
        script(src, "test-cluster.sh", "start", os.path.join(d, "cluster"), "--nodes", str(nodes), "--gpus", str(gpus),
               "--zones", str(zones), "--bin-dir", bin_dir)
        print("test cluster of %d real nodes up in %.0f s" % (nodes, time.monotonic() - t0), flush=True)
        with open(os.path.join(d, "token.key"), "w") as f:
            f.write(subprocess.run(["base64"], input=os.urandom(48), capture_output=True, check=True).stdout.decode())
        # The rendezvous on this machine's address on the nodes' bridge, where the pods reach it; the
        # same port for every controller, so that it survives their restarts.
        with open(os.path.join(d, "cluster", "apiserver.addr")) as f:
            host = f.read().strip()
        s = socket.socket()
        s.bind((host, 0))
        port = s.getsockname()[1]
        s.close()
        with open(state_file, "w") as f:
            json.dump({"dir": d, "rendezvous_host": host, "rendezvous_port": port}, f)
        return Cluster(bin_dir, src, state_file)

    @staticmethod
    def destroy(src, state_file):
        """Kills the controllers, stops the cluster and removes its directory and the state file."""
        try:
            with open(state_file) as f:
                d = json.load(f)["dir"]
        except (OSError, ValueError, KeyError):
            d = None
        if d and os.path.isdir(d):
            for pid_file in os.listdir(d):
                if pid_file.startswith("controller-") and pid_file.endswith(".pid"):
                    kill(read_int(os.path.join(d, pid_file)))
            subprocess.run(["bash", os.path.join(src, "scripts", "test-cluster.sh"), "stop", os.path.join(d, "cluster")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            shutil.rmtree(d, ignore_errors=True)
        if os.path.exists(state_file):
            os.remove(state_file)

    def script(self, *args):
        """scripts/test-cluster.sh VERB (this cluster's directory) ARGS..."""
        script(self.src, "test-cluster.sh", args[0], os.path.join(self.dir, "cluster"), *args[1:])

    # -- kubectl

    def kubectl(self, *args, input=None, check=True):
        r = subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True, timeout=180)
        if check and r.returncode != 0:
            raise Failure("kubectl %s: %s" % (" ".join(args), r.stderr.strip()))
        return r.stdout

    def field(self, ns, path, job=JOB):
        """A job's field by JSONPath; empty while the API server does not answer (the waits poll
        again, the checks fail with a message)."""
        r = subprocess.run(["kubectl", "get", "tj", job, "-n", ns, "-o", "jsonpath={%s}" % path], capture_output=True,
                           text=True, timeout=60)
        return r.stdout if r.returncode == 0 else ""

    def int_field(self, ns, path, job=JOB):
        try:
            return int(self.field(ns, path, job))
        except ValueError:
            return None

    def events(self, ns):
        return self.kubectl("get", "events", "-n", ns, "--no-headers", check=False)

    def job(self, ns, *edits):
        """The example, in namespace NS, with its paths in the cluster's directory and EDITS, each a
        (regular expression, replacement) pair applied to every line."""
        self.kubectl("create", "namespace", ns)
        text = open(os.path.join(self.src, "examples", "cosmoflow-k8s.yaml")).read()
        text = text.replace("/var/tmp/tessera/cosmoflow-k8s", os.path.join(self.dir, ns))
        # The test cluster's GPUs are device IDs with no GPU behind them: the workers train on the CPU.
        text = re.sub(r"^(  image: .*)$", r"\1\n  device: cpu", text, flags=re.M)
        for pattern, repl in edits:
            text = re.sub(pattern, repl, text, flags=re.M)
        self.kubectl("apply", "-n", ns, "-f", "-", input=text)

    def wait_for(self, ns, path, want, limit):
        got = ""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            got = self.field(ns, path)
            if got == want:
                return
            if want != "Failed" and path != ".status.reason" and self.field(ns, ".status.phase") == "Failed":
                raise Failure("%s/%s failed: %s" % (ns, JOB, self.field(ns, ".status.message")))
            time.sleep(0.5)
        raise Failure("%s/%s: %s is '%s', not '%s', after %d s" % (ns, JOB, path, got, want, limit))

    def wait_step(self, ns, step, limit):
        """Until the job's status reports at least STEP."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            s = self.int_field(ns, ".status.step")
            if s is not None and s >= step:
                return
            time.sleep(0.5)
        raise Failure("%s/%s did not reach step %d in %d s (status: %s)" % (ns, JOB, step, limit,
                                                                           self.field(ns, ".status")))

    def pods_of(self, ns):
        out = self.kubectl("get", "pods", "-n", ns, "-l", "tessera.dev/job", "--no-headers", check=False)
        return len(out.splitlines())

    def pods_become(self, ns, count, limit):
        """Whether NS holds COUNT pods of a job within LIMIT s. Deleted pods go once the kubelet has
        removed their sandboxes, which kubelet 1.20 sometimes leaves to its container garbage
        collection, run once a minute."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.pods_of(ns) == count:
                return True
            time.sleep(0.5)
        return False

    def first_pod_node(self, ns):
        return self.kubectl("get", "pods", "-n", ns, "-l", "tessera.dev/job", "-o", "jsonpath={.items[0].spec.nodeName}")

    # -- nodes

    def nodes(self):
        """{name: 'Ready' | 'Ready,SchedulingDisabled' | 'NotReady' ...}"""
        out = self.kubectl("get", "nodes", "--no-headers", check=False)
        return {f[0]: f[1] for f in (line.split() for line in out.splitlines()) if len(f) > 1}

    def ready_nodes(self):
        return sorted(n for n, s in self.nodes().items() if s == "Ready")

    def add_node(self):
        try:
            self.script("add-node")
        except subprocess.CalledProcessError:
            raise Failure("a node did not join")

    def schedulable_nodes(self, count):
        """Exactly COUNT ready nodes that take pods: the extra ones cordoned, the cordoned ones
        uncordoned or new ones added when there are too few. Returns the nodes it cordoned."""
        for name, s in sorted(self.nodes().items()):
            if s == "Ready,SchedulingDisabled" and len(self.ready_nodes()) < count:
                self.kubectl("uncordon", name)
        while len(self.ready_nodes()) < count:
            self.add_node()
        cordoned = self.ready_nodes()[count:]
        for name in cordoned:
            self.kubectl("cordon", name)
        return cordoned

    def uncordon(self, names):
        for name in names:
            self.kubectl("uncordon", name, check=False)

    def spare_node(self):
        """A node to spare beside the example's four."""
        self.schedulable_nodes(5)

    # -- controllers

    def pid_file(self, name):
        return os.path.join(self.dir, "controller-%s.pid" % name)

    def log_file(self, name):
        return os.path.join(self.dir, "controller-%s.log" % name)

    def controller_args(self, *flags, kubeconfig=None):
        return [os.path.join(self.bin, "tessera-controller"), "--kubeconfig", kubeconfig or self.kubeconfig, *self.key,
                "--rendezvous-listen", self.rendezvous, "--status-interval", "1", *flags]

    def start_controller(self, name, *flags):
        """A controller in its own session, which outlives this process. The log of `main` is
        appended to, across its restarts; any other's starts afresh."""
        with open(self.log_file(name), "a" if name == "main" else "w") as log:
            p = subprocess.Popen(self.controller_args(*flags), stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        with open(self.pid_file(name), "w") as f:
            f.write(str(p.pid))

    def stop_controller(self, name):
        kill(read_int(self.pid_file(name)))
        if os.path.exists(self.pid_file(name)):
            os.remove(self.pid_file(name))

    def only_main_controller(self):
        """The state every scenario starts from: the controller `main` running, no other."""
        for f in os.listdir(self.dir):
            m = re.fullmatch(r"controller-(.*)\.pid", f)
            if m and m.group(1) != "main":
                self.stop_controller(m.group(1))
        pid = read_int(self.pid_file("main"))
        if not pid or not alive(pid):
            self.start_controller("main")

    def wait_log(self, name, text, limit):
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if text in self.log(name):
                return True
            time.sleep(0.5)
        return False

    def log(self, name):
        try:
            with open(self.log_file(name)) as f:
                return f.read()
        except OSError:
            return ""

    def logs(self):
        """Every controller's log, one text."""
        return "".join(self.log(f[len("controller-"):-len(".log")]) for f in sorted(os.listdir(self.dir))
                       if f.startswith("controller-") and f.endswith(".log"))

    # -- diagnostics

    def describe(self):
        """What a failed scenario prints: the controllers' logs' ends, the pods, and for each pod of a
        job its containers' states, its log's end and its kubelet's lines on it."""
        out = ["--- controller logs (end)"]
        for line in self.logs().splitlines()[-30:]:
            out.append(line)
        out.append("--- pods")
        out.append(self.kubectl("get", "pods", "-A", "-o", "wide", check=False))
        listing = self.kubectl("get", "pods", "-A", "-l", "tessera.dev/job", "-o", "wide", "--no-headers", check=False)
        for f in (line.split() for line in listing.splitlines()):
            if len(f) < 8:
                continue
            ns, pod, node = f[0], f[1], f[7]
            state = self.kubectl("get", "pod", pod, "-n", ns, "-o", "jsonpath={.status.containerStatuses[*].state}",
                                 check=False)
            out.append("--- %s/%s: %s" % (ns, pod, state))
            out.append(self.kubectl("logs", pod, "-n", ns, "--tail", "15", check=False))
            out.append("--- %s's kubelet on %s" % (node, pod))
            try:
                with open(os.path.join(self.dir, "cluster", "nodes", node, "logs", "kubelet.log")) as k:
                    out.extend([line.rstrip() for line in k if pod in line][-15:])
            except OSError:
                pass
        return "\n".join(out)


def script(src, name, *args):
    subprocess.run(["bash", os.path.join(src, "scripts", name), *args], check=True)


def read_int(path):
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def kill(pid):
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def since(t0):
    """Seconds since the time.time() T0, to a tenth."""
    return round(time.time() - t0, 1)
