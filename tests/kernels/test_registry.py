"""kernels/registry.py: each pass's candidates in order, the reasons of an explicit backend's
refusal, the specs it enumerates (each with its samples, and each compiling), and the host
layer's single door to the kernels."""

import ast
import dataclasses
import pathlib

import pytest
from helpers import assert_jobs_clean, attention_problem, decode_problem

from numba_flash.kernels import registry
from numba_flash.kernels.tc import (backward_mma, backward_wgmma, forward_mma, forward_wgmma_ws,
                                    mla_decode_mma, mla_decode_seesaw, mla_decode_wgmma)
from numba_flash.runtime import ptxcheck
from numba_flash.runtime.device import Device

HOPPER = Device(cc=(9, 0), sms=132, shared_per_block=232448)
A100 = dataclasses.replace(HOPPER, cc=(8, 0), sms=108, shared_per_block=166912)
PACKAGE = pathlib.Path(registry.__file__).resolve().parents[1]


def decode(d=576, dv=512, rows=64, aligned=True, page=64):
    return decode_problem(d, dv, rows, page, offset=0 if aligned else 1)


def test_each_pass_takes_its_family_on_each_device():
    assert registry.choose("forward", "tc", None, HOPPER).specs == (forward_wgmma_ws.SPEC,)
    assert registry.choose("forward", "tc", None, A100).specs == (forward_mma.SPEC,)
    assert registry.choose("backward", "tc", attention_problem(128), HOPPER).specs == (
        backward_wgmma.DKDV, backward_wgmma.DQ)
    assert registry.choose("backward", "tc", attention_problem(256), HOPPER).specs == (
        backward_mma.DKDV, backward_mma.DQ)
    assert registry.choose("decode", "tc", decode(), HOPPER).specs == (mla_decode_seesaw.SPEC,)
    assert registry.choose("decode", "tc", decode(page=16), HOPPER).specs == (
        mla_decode_wgmma.SPEC,)
    assert registry.choose("decode", "tc", decode(page=16), A100).specs == (
        mla_decode_mma.SPEC,)


def test_decode_configs_carry_the_copy_path():
    assert registry.choose("decode", "tc", decode(), HOPPER).config(decode()).tma
    small = decode(page=16)
    assert not registry.choose("decode", "tc", small, HOPPER).config(small).tma
    simt = registry.choose("decode", "simt", decode(aligned=False), HOPPER)
    assert simt.config(decode(aligned=False)).vec is False


def test_an_explicit_backend_that_no_kernel_takes_gets_every_reason():
    with pytest.raises(ValueError) as refused:
        registry.choose("decode", "tc", decode(dv=576), A100)
    message = str(refused.value)
    assert message.startswith("backend: no 'tc' kernel runs this decode: ")
    for name, why in (("tc.mla_decode_seesaw", "needs compute capability 9.0, not 8.0"),
                      ("tc.mla_decode_wgmma", "needs compute capability 9.0, not 8.0"),
                      ("tc.mla_decode_mma", "the tensor-core decode takes head dims")):
        assert f"{name}: {why}" in message, message
    with pytest.raises(ValueError, match="tc.mla_decode_wgmma: the tensor-core decode copies"):
        registry.choose("decode", "tc", decode(aligned=False), HOPPER)


def test_specs_lists_every_launched_spec_once():
    specs = registry.specs()
    assert len(specs) == len(set(map(id, specs)))
    for entry in registry.ENTRIES:
        assert all(spec in specs for spec in entry.specs), entry.name
    for spec in (registry.PREPROCESS, registry.SINK_GRAD, registry.COMBINE, registry.METADATA,
                 registry.SPARSE_INDICES, *registry.NAIVE):
        assert spec in specs


def test_every_spec_has_samples_and_each_key_names_one_specialization():
    """``tools/ptx_hashes.py`` hashes the samples by key and keeps the first of a key: two
    samples of one key must be the same build."""
    jobs = {}
    for spec in registry.specs():
        samples = spec.samples()
        assert samples, spec.name
        for key, job in ptxcheck.sample_jobs(spec, samples):
            assert jobs.setdefault(key, job) == job, key


def test_every_spec_compiles_without_spills():
    """The first (cheapest) sample of every spec, for each of its compute capabilities; the
    kernels' own tests compile more of them, with the instructions each must hold."""
    assert_jobs_clean([job for spec in registry.specs()
                       for job in ptxcheck.sample_jobs(spec, spec.samples()[:1])])


@pytest.mark.parametrize("module", ["api.py", "backends.py", "validate.py", "torch_plans.py"])
def test_the_host_layer_reaches_kernels_through_the_registry_alone(module):
    """The host layer imports the registry and the problem description it fills, no kernel."""
    tree = ast.parse((PACKAGE / module).read_text())
    imported = {node.module for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module}
    imported |= {f"{node.module}.{a.name}" for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module for a in node.names}
    kernels = {m for m in imported if m.startswith("kernels.") or m == "kernels"}
    assert kernels <= {"kernels", "kernels.registry", "kernels.problem",
                       "kernels.problem.Attention", "kernels.problem.Decode"}, kernels


def test_a_problem_option_goes_only_to_a_kernel_that_honours_it(monkeypatch):
    plain = attention_problem(64)
    fp8 = plain._replace(descale=("q", "k", "v"))  # only the FP8 kernel implements it
    assert plain.options() == frozenset() and fp8.options() == {"descale"}
    assert registry.choose("forward", "tc", fp8, HOPPER).name == "tc.forward_wgmma_fp8"
    assert registry.choose("forward", "simt", fp8, HOPPER).name == "simt.forward"
    with pytest.raises(ValueError) as refused:  # paged K/V, which the FP8 kernel does not take
        registry.choose("forward", "tc", fp8._replace(block_table="table"), HOPPER)
    for why in ("tc.forward_wgmma_ws: does not implement block_table, descale",
                "tc.forward_wgmma: does not implement descale",
                "tc.forward_mma: does not implement descale",
                "tc.forward_wgmma_fp8: does not implement block_table"):
        assert why in str(refused.value)
    honouring = registry.ENTRIES[1]._replace(honours=frozenset({"descale", "window"}))
    monkeypatch.setattr(registry, "ENTRIES", (registry.ENTRIES[0], honouring))
    assert registry.choose("forward", "tc", fp8, HOPPER) is honouring
    assert registry.choose("forward", "tc", plain, HOPPER) is registry.ENTRIES[0]
