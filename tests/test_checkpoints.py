"""Checkpoints survive a crash in the middle of a save: the last complete one stays the latest."""
import os
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np

from t5lite.train.checkpoints import Checkpointer

CRASHING_SAVE = textwrap.dedent("""
    import os, sys
    import jax.numpy as jnp
    from t5lite.train.checkpoints import Checkpointer
    ckpt = Checkpointer(sys.argv[1], save_every=1)
    ckpt.save(1, {"w": jnp.full((256, 256), 1.0)}, {"examples_consumed": 10})
    ckpt.wait()
    ckpt.save(2, {"w": jnp.full((256, 256), 2.0)}, {"examples_consumed": 20})
    os._exit(17)  # die while the asynchronous save of step 2 is in flight
""")


def test_crash_mid_save_keeps_the_last_good_checkpoint(tmp_path):
    directory = str(tmp_path / "ckpt")
    proc = subprocess.run([sys.executable, "-c", CRASHING_SAVE, directory], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 17, proc.stderr
    ckpt = Checkpointer(directory, save_every=1)
    step = ckpt.latest_step()
    assert step in (1, 2)  # 2 only if the save happened to finish before the crash
    state, data, restored_step = ckpt.restore({"w": jnp.zeros((256, 256))})
    np.testing.assert_array_equal(np.asarray(state["w"]), np.full((256, 256), float(step)))
    assert data == {"examples_consumed": 10 * step} and restored_step == step
    ckpt.close()


def test_partial_directory_left_by_a_crash_is_ignored(tmp_path):
    directory = str(tmp_path / "ckpt")
    ckpt = Checkpointer(directory, save_every=1, async_save=False)
    ckpt.save(1, {"w": jnp.ones(3)}, {"examples_consumed": 4})
    ckpt.close()
    # What an interrupted save leaves behind: a temporary directory with half the files.
    partial = os.path.join(directory, "2.orbax-checkpoint-tmp-1234567")
    os.makedirs(os.path.join(partial, "state"))
    with open(os.path.join(partial, "state", "garbage"), "w") as f:
        f.write("half written")
    ckpt = Checkpointer(directory, save_every=1)
    assert ckpt.latest_step() == 1
    state, data, _ = ckpt.restore({"w": jnp.zeros(3)})
    np.testing.assert_array_equal(np.asarray(state["w"]), np.ones(3))
    ckpt.close()
