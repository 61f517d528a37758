"""Checkpoints load with ``weights_only=True`` only: a crafted pickle cannot run code, bad files name themselves."""

import io
import os
import random
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from l0bayes.io import (
    CheckpointError,
    load_checkpoint,
    numpy_rng_state,
    save_checkpoint,
    set_numpy_rng_state,
)
from l0bayes.pruning import load_pruned


class _Exploit:
    """Unpickling this calls ``os.system``-like code: here it would create a marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_malicious_pickle_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "ckpt.pt"
    torch.save({"epoch": 1, "payload": _Exploit(str(marker))}, path)
    with pytest.raises(CheckpointError, match="ckpt.pt"):
        load_checkpoint(path)
    assert not marker.exists()


def test_malicious_checkpoint_on_resume_runs_nothing(tmp_path):
    from l0bayes.inference import train
    from l0bayes.models import SparseLinearRegression

    marker = tmp_path / "pwned"
    path = tmp_path / "ckpt.pt"
    torch.save({"epoch": 1, "model": _Exploit(str(marker))}, path)
    model = SparseLinearRegression(3)
    x, y = torch.randn(20, 3), torch.randn(20)
    with pytest.raises(ValueError, match="ckpt.pt"):
        train(model, x, y, epochs=2, checkpoint=str(path), resume=True, progress=False)
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"", b"not a zip file at all", b"PK\x03\x04truncated"])
def test_corrupt_files_raise_value_error_naming_the_file(tmp_path, content):
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="bad.pt"):
        load_checkpoint(path)


def test_a_short_text_file_is_a_checkpoint_error(tmp_path):
    # torch's loader reads it as a legacy pickle and raised a bare KeyError (the byte 'e', 101).
    path = tmp_path / "notes.pt"
    path.write_bytes(b"hello")
    with pytest.raises(CheckpointError, match=r"notes\.pt.*truncated or corrupt"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match=r"notes\.pt"):
        load_pruned(path)


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(content=st.binary(min_size=1, max_size=64))
def test_any_bytes_load_or_raise_a_checkpoint_error(tmp_path, content):
    path = tmp_path / "any.pt"
    path.write_bytes(content)
    try:
        state = load_checkpoint(path)
    except CheckpointError as err:
        assert "any.pt" in str(err)
    else:
        assert isinstance(state, dict)


def test_damaged_checkpoints_load_or_raise_a_checkpoint_error(tmp_path):
    # Bytes changed at random in a real checkpoint (both of torch's formats): torch's loader raises KeyError,
    # IndexError, struct.error, AssertionError, UnicodeDecodeError, ... for some of them.
    path = tmp_path / "c.pt"
    state = {"epoch": 3, "w": torch.arange(6.0), "history": [{"loss": 1.5}]}
    originals = []
    for zipped in (True, False):
        buffer = io.BytesIO()
        torch.save(state, buffer, _use_new_zipfile_serialization=zipped)
        originals.append(buffer.getvalue())
    rng = random.Random(0)
    errors = set()
    for _ in range(150):
        data = bytearray(rng.choice(originals))
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        path.write_bytes(bytes(data[: rng.randint(1, len(data))] if rng.random() < 0.3 else data))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch's warnings about unusual pickle protocols
                loaded = load_checkpoint(path)
        except CheckpointError as err:
            assert "c.pt" in str(err)
            errors.add(str(err).split("(")[-1].split(":")[0])
        else:
            assert isinstance(loaded, dict)
    assert len(errors) >= 3  # several kinds of damage were met


def test_truncated_checkpoint(tmp_path):
    path = tmp_path / "c.pt"
    save_checkpoint(path, {"epoch": 3, "w": torch.randn(1000)})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="c.pt"):
        load_checkpoint(path)


def test_missing_keys_and_non_dict(tmp_path):
    path = tmp_path / "c.pt"
    save_checkpoint(path, {"epoch": 3})
    with pytest.raises(ValueError, match="'model'"):
        load_checkpoint(path, required=("epoch", "model"))
    torch.save([1, 2], path)
    with pytest.raises(ValueError, match="list"):
        load_checkpoint(path)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "absent.pt")


def test_save_is_atomic_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "c.pt"
    save_checkpoint(path, {"epoch": 1, "t": torch.arange(3)})
    save_checkpoint(path, {"epoch": 2, "t": torch.arange(4)})
    state = load_checkpoint(path)
    assert state["epoch"] == 2 and torch.equal(state["t"], torch.arange(4))
    assert os.listdir(tmp_path) == ["c.pt"]
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask  # the file mode a plain open() would give


def test_save_refuses_what_a_safe_load_cannot_read(tmp_path):
    path = tmp_path / "c.pt"
    with pytest.raises(CheckpointError):
        save_checkpoint(path, {"thing": _Exploit(str(tmp_path / "x"))})
    assert not path.exists() and os.listdir(tmp_path) == []


def test_numpy_rng_state_round_trip(tmp_path):
    np.random.seed(123)
    np.random.standard_normal()  # leaves a cached Gaussian in the state
    path = tmp_path / "c.pt"
    save_checkpoint(path, {"numpy": numpy_rng_state()})
    expected = np.random.standard_normal(5)
    np.random.seed(0)
    set_numpy_rng_state(load_checkpoint(path)["numpy"])
    np.testing.assert_array_equal(np.random.standard_normal(5), expected)


def test_tensors_of_the_device_round_trip(tmp_path, device):
    """A state with tensors on the device (CUDA's generator state included there) loads, safely, onto either device."""
    g = torch.Generator().manual_seed(0)
    weights = torch.randn(7, 3, generator=g, dtype=torch.float64)
    state = {"epoch": 2, "w": weights.to(device), "rng": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    path = tmp_path / "c.pt"
    save_checkpoint(path, state)
    for where in ("cpu", device):
        loaded = load_checkpoint(path, map_location=where)
        assert loaded["w"].device.type == torch.device(where).type
        assert torch.equal(loaded["w"].cpu(), weights) and torch.equal(loaded["rng"].cpu(), state["rng"])
    if device.type == "cuda":
        torch.cuda.set_rng_state_all(load_checkpoint(path)["cuda_rng"])
        first = torch.rand(5, device=device)
        torch.cuda.set_rng_state_all(state["cuda_rng"])
        assert torch.equal(torch.rand(5, device=device), first)


def test_resume_reads_rng_states_onto_the_cpu(tmp_path):
    """train(resume=True) on CUDA passes map_location="cuda"; the RNG states it restores must stay CPU tensors."""
    from l0bayes.inference import train
    from l0bayes.inference.distributed import DataParallelContext
    from l0bayes.models import SparseLinearRegression

    path = tmp_path / "ckpt.pt"
    x, y = torch.randn(40, 3), torch.randn(40)
    train(SparseLinearRegression(3), x, y, epochs=1, batch_size=20, checkpoint=str(path), progress=False)
    state = DataParallelContext(False, "cpu").load(str(path), map_location="meta")  # any device but the CPU
    assert state["rng"]["torch"].device.type == "cpu" and state["shuffle"].device.type == "cpu"
    torch.set_rng_state(state["rng"]["torch"])  # what resuming does with it
    assert all(t.device.type == "cpu" for t in state["model"].values())


def test_a_callback_state_is_saved_with_numbers_and_a_foreign_object_is_refused_by_name(tmp_path):
    """NumPy scalars in a callback's state become Python numbers; an object that a weights_only load cannot
    rebuild is refused naming the callback, not a temporary file."""
    from l0bayes.inference import train
    from l0bayes.inference.callbacks import Callback
    from l0bayes.models import SparseLinearRegression

    class Counter(Callback):
        state_key = "counter"

        def __init__(self, value):
            self.value = value

        def state_dict(self):
            return {"value": self.value}

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(20, 3, generator=g), torch.randn(20, generator=g)
    path = tmp_path / "c.pt"
    kw = dict(epochs=1, progress=False, checkpoint=str(path))
    train(SparseLinearRegression(3), x, y, callbacks=[Counter(np.float64(2.5))], **kw)
    saved = load_checkpoint(path)["callbacks"]["counter"]["value"]
    assert saved == 2.5 and type(saved) is float
    refused = r"^the state_dict\(\) of callback 'counter' holds <object object at \w+>, a builtins.object, which a"
    with pytest.raises(TypeError, match=refused):
        train(SparseLinearRegression(3), x, y, callbacks=[Counter([1.0, object()])], **kw)
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_a_tensor_whose_elements_share_memory_is_refused_and_views_load(tmp_path):
    """A 2 kB file whose weight is ``ones(1).expand(3000, 3000)`` loaded (and trained at 36 MB, or 6.9 GB at
    30000 x 30000): refused naming the entry; transposed, sliced, empty and 0-d tensors, whose elements are distinct,
    load as they were."""
    path = tmp_path / "shared.pt"
    torch.save({"model": {"w": torch.ones(1).expand(3000, 3000)}}, path)
    assert path.stat().st_size < 4096
    with pytest.raises(CheckpointError, match=r"share memory \(the checkpoint\['model'\]\['w'\]: shape \(3000, 3000\)"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="share memory"):
        load_pruned(path)
    torch.save({"w": torch.ones(6).as_strided((3, 4), (1, 1))}, path)  # overlapping with no stride 0
    with pytest.raises(CheckpointError, match="share memory"):
        load_checkpoint(path)
    views = {
        "t": torch.randn(4, 5).T,
        "s": torch.randn(3, 1, 8)[:, :, ::2],
        "e": torch.zeros(0, 3),
        "z": torch.tensor(2.0),
        "one": torch.ones(1).expand(1, 1),
    }
    torch.save({"views": views}, path)
    loaded = load_checkpoint(path)["views"]
    assert all(torch.equal(loaded[k], v) for k, v in views.items())


def test_cpu_copy_keeps_the_structure_and_shares_no_tensor():
    from l0bayes.io import cpu_copy

    t = torch.arange(3.0, requires_grad=True)
    state = {"a": t, "b": [t * 2, (1, "x", None)], "c": 4}
    copied = cpu_copy(state)
    assert copied["c"] == 4 and copied["b"][1] == (1, "x", None) and isinstance(copied["b"], list)
    assert torch.equal(copied["a"], t.detach()) and not copied["a"].requires_grad
    with torch.no_grad():
        t.add_(1.0)  # the original moves on; the copy stays
    assert copied["a"].tolist() == [0.0, 1.0, 2.0] and copied["b"][0].tolist() == [0.0, 2.0, 4.0]
