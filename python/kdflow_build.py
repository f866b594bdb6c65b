"""`pip install .` for kdflow's Python module: an in-tree PEP 517 backend (pyproject.toml names it;
no build requirement is downloaded). Building the wheel runs the project's own set-up and build
(scripts/build.sh release: Debian packages, the dependency venv, CMake), then packs the built
module (build/release/python/kdflow) into a wheel for the python the module is built for (the
dependency venv's; its RPATH names that venv's LibTorch, oneDNN and oneTBB, so the wheel is for this
machine)."""
import base64
import hashlib
import os
import subprocess
import sys
import sysconfig
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME, VERSION = "kdflow", "0.1.0"


def _tag():
    so = [f for f in os.listdir(os.path.join(ROOT, "build", "release", "python", "kdflow"))
          if f.startswith("_kdflow.") and f.endswith(".so")]
    if not so:
        raise RuntimeError("kdflow: the build made no _kdflow module (scripts/build.sh release)")
    abi = so[0].split(".")[1]  # cpython-311-x86_64-linux-gnu
    py = "cp" + abi.split("-")[1]
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{py}-{py}-{platform}", so[0]


def _metadata():
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n"
            "Summary: knowledge distillation with the teacher on CPU cores (kdflow's Python module)\n"
            "Requires-Python: >=3.11\nRequires-Dist: numpy\n")


def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    info = os.path.join(metadata_directory, f"{NAME}-{VERSION}.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(_metadata())
    return os.path.basename(info)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    # pip's build isolation points PYTHONPATH at a sitecustomize that hides site-packages from
    # every python started below: the set-up and the build must see the dependency venv's own.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME", "PYTHONEXECUTABLE")}
    subprocess.run(["bash", os.path.join(ROOT, "scripts", "build.sh"), "release"], check=True,
                   stdout=sys.stderr, env=env)
    tag, so = _tag()
    wheel = f"{NAME}-{VERSION}-{tag}.whl"
    info = f"{NAME}-{VERSION}.dist-info"
    package = os.path.join(ROOT, "build", "release", "python", "kdflow")
    files = {f"kdflow/{name}": open(os.path.join(package, name), "rb").read()
             for name in ("__init__.py", so)}
    files[f"{info}/METADATA"] = _metadata().encode()
    files[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: kdflow_build\n"
                              f"Root-Is-Purelib: false\nTag: {tag}\n").encode()
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            z.writestr(path, data)
    return wheel
