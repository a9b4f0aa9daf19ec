"""Deployment artefacts: `make install` (PREFIX/DESTDIR: binary, CUDA library when built,
config never overwritten, systemd unit with this install's paths, accepted by
systemd-analyze), and the Kubernetes manifests of deploy/kubernetes/ (validated against
the official schemas by scripts/validate-k8s.sh, their tessera.yaml accepted by tessera
itself, probes on /health, GPU requests, and a grace period that covers the drain)."""
import filecmp
import os
import pathlib
import shutil
import stat
import subprocess

from conftest import BIN, BUILD, ROOT

K8S = ROOT / "deploy" / "kubernetes"


def _make_install(dest, *extra):
    build = os.path.relpath(BUILD, ROOT)
    p = subprocess.run(["make", "-s", f"BUILD={build}", f"DESTDIR={dest}", *extra, "install"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout + p.stderr


def _mode(p):
    return stat.S_IMODE(os.stat(p).st_mode)


def test_make_install_prefix_destdir(tmp_path):
    dest = tmp_path / "root"
    _make_install(dest, "PREFIX=/usr")
    binary = dest / "usr/bin/tessera"
    assert binary.is_file() and _mode(binary) == 0o755
    assert filecmp.cmp(binary, BIN, shallow=False)
    cuda = BUILD / "libtessera-cuda.so"
    assert (dest / "usr/bin/libtessera-cuda.so").exists() == cuda.exists()
    conf = dest / "etc/tessera/tessera.yaml"
    assert conf.is_file() and _mode(conf) == 0o640
    assert conf.read_text() == (ROOT / "config/tessera.yaml").read_text()
    unit = dest / "lib/systemd/system/tessera.service"
    text = unit.read_text()
    assert "ExecStart=/usr/bin/tessera serve --config /etc/tessera/tessera.yaml" in text, text
    assert "Type=notify" in text and "WatchdogSec=" in text and "ExecReload=/bin/kill -HUP $MAINPID" in text
    assert "/usr/local" not in text
    # the installed binary runs
    p = subprocess.run([str(binary), "serve", "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "--api-key-file" in p.stdout

    # a second install keeps an edited configuration and puts the new example beside it
    conf.write_text("# edited\nport: 9000\n")
    out = _make_install(dest, "PREFIX=/usr")
    assert conf.read_text() == "# edited\nport: 9000\n"
    assert (dest / "etc/tessera/tessera.yaml.new").read_text() == (ROOT / "config/tessera.yaml").read_text()
    assert "kept" in out

    # PREFIX=/usr/local (the default): binary and unit under /usr/local, config in /etc
    dest2 = tmp_path / "root2"
    _make_install(dest2)
    assert (dest2 / "usr/local/bin/tessera").is_file()
    unit2 = (dest2 / "usr/local/lib/systemd/system/tessera.service").read_text()
    assert "ExecStart=/usr/local/bin/tessera serve --config /etc/tessera/tessera.yaml" in unit2
    assert (dest2 / "etc/tessera/tessera.yaml").is_file()


def test_systemd_unit_verifies(tmp_path):
    """systemd-analyze accepts the unit (no unknown keys, no bad values); it checks that the
    binary exists, so the unit is pointed at the built one."""
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze not found (Debian package systemd)"
    text = (ROOT / "docker/tessera.service").read_text().replace("/usr/local/bin/tessera", str(BIN))
    unit = tmp_path / "tessera.service"
    unit.write_text(text)
    p = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    # the unit's user need not exist here; anything else is a defect of the unit
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip() and "tessera" in ln
             and "User" not in ln and "Group" not in ln]
    assert p.returncode == 0 and not lines, p.stdout + p.stderr
    # and a broken key is noticed (the check can fail)
    unit.write_text(text.replace("WatchdogSec=", "WatchdogSecs="))
    p = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert "Unknown key" in p.stdout + p.stderr


def _validate(*files):
    return subprocess.run([str(ROOT / "scripts/validate-k8s.sh"), *map(str, files)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_kubernetes_manifests_validate():
    p = _validate()
    assert p.returncode == 0, p.stdout + p.stderr
    for name in ("configmap", "secret", "deployment", "service", "pdb", "models-pvc"):
        assert f"deploy/kubernetes/{name}.yaml passed" in p.stdout + p.stderr, p.stdout + p.stderr


def test_kubernetes_validation_can_fail(tmp_path):
    bad = tmp_path / "deployment.yaml"
    bad.write_text((K8S / "deployment.yaml").read_text().replace("replicas: 2", "replicaz: 2"))
    p = _validate(bad)
    assert p.returncode != 0, p.stdout + p.stderr


def _load_yaml(path):
    # PyYAML comes with the validator's environment (scripts/validate-k8s.sh)
    py = ROOT / "build" / "k8s-venv" / "bin" / "python"
    if not py.exists():
        _validate()
    out = subprocess.run([str(py), "-c", "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
                          str(path)], capture_output=True, text=True, check=True)
    import json
    return json.loads(out.stdout)


def test_kubernetes_manifests_fit_tessera(tmp_path):
    """The ConfigMap's tessera.yaml is a valid tessera configuration; the Deployment probes
    /health on the configured port, asks for a GPU, and gives the drain enough time."""
    cm = _load_yaml(K8S / "configmap.yaml")[0]
    secret = _load_yaml(K8S / "secret.yaml")[0]
    dep = _load_yaml(K8S / "deployment.yaml")[0]
    svc = _load_yaml(K8S / "service.yaml")[0]
    conf = tmp_path / "tessera.yaml"
    conf.write_text(cm["data"]["tessera.yaml"])
    keys = tmp_path / "keys"
    keys.write_text(secret["stringData"]["keys"])
    p = subprocess.run([str(BIN), "serve", "--config", str(conf), "--api-key-file", str(keys),
                        "--print-config"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    effective = p.stdout
    drain = float(next(ln.split(":", 1)[1] for ln in effective.splitlines() if ln.startswith("drain-timeout:")))
    port = int(next(ln.split(":", 1)[1] for ln in effective.splitlines() if ln.startswith("port:")))

    spec = dep["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert dep["spec"]["replicas"] >= 2
    assert c["ports"][0]["containerPort"] == port
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["path"] == "/health", probe
    assert c["resources"]["requests"]["nvidia.com/gpu"] == c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert spec["terminationGracePeriodSeconds"] >= pre_stop + drain + 10, (spec["terminationGracePeriodSeconds"], drain)
    live = c["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] > drain, "liveness would kill a draining pod"
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert "/etc/tessera/tessera.yaml" in mounts and "/etc/tessera/keys" in mounts
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"][0]["targetPort"] == c["ports"][0]["name"]
