"""t5lite's default XLA:CPU options: added to XLA_FLAGS, never over the user's, with an opt-out."""
import subprocess
import sys

from t5lite import xla_flags


def test_defaults_are_added_without_overriding_the_users_flags():
    assert xla_flags.with_cpu_defaults("") == "--xla_cpu_use_xnnpack=true"
    assert (xla_flags.with_cpu_defaults("--xla_force_host_platform_device_count=8")
            == "--xla_force_host_platform_device_count=8 --xla_cpu_use_xnnpack=true")
    assert xla_flags.with_cpu_defaults("--xla_cpu_use_xnnpack=false") == "--xla_cpu_use_xnnpack=false"


def _flags_after_import(env_extra):
    code = "import os, t5lite; print(os.environ.get('XLA_FLAGS', ''))"
    env = {"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu", **env_extra}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""


def test_importing_t5lite_sets_them_unless_opted_out():
    assert _flags_after_import({}) == "--xla_cpu_use_xnnpack=true"
    assert _flags_after_import({"XLA_FLAGS": "--xla_cpu_use_xnnpack=false"}) == "--xla_cpu_use_xnnpack=false"
    assert _flags_after_import({"T5LITE_NO_XLA_CPU_DEFAULTS": "1"}) == ""
