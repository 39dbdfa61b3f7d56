"""The SGLang engine (grpo_edu/sampling/sglang_engine.py) against SGLang 0.5.23's own API.

- The API check: every route, request field, sampling key, answer field, launch flag, memory tag
  and environment variable the engine uses is in SGLang 0.5.23's source, frozen from the released
  wheel in tests/sglang_api_0.5.23.json (tests/freeze_sglang_api.py). Where GRPO_EDU_SGLANG_SOURCE
  names the pinned source (`make test-sglang`), the freeze is re-run and must give that file, and
  SGLang's own generated JSON contract decodes the engine's requests and the stand-in's answers.
- The state SGLang keeps across the engine's calls, read from the same source into the frozen
  file's "protocol" (each rule with its file and line): the weight-update session a tensor sync
  must open and close, memory release and resume and what a broken precondition does (the
  server ends), where a completion ends. Each rule is held on the stand-in, which keeps it.
- The engine against the stand-in server (tests/sglang_standin.py, a real HTTP server that
  checks every request against the frozen fields): the one /generate request of a rollout, its
  seeds, the log-probs against the trainer's fused forward, the weights reaching the server by
  disk and by tensors, sleep, and the one-line errors of a server that is absent, fails,
  answers badly, times out or was started without what the run needs.
- Starting the server (`python -m sglang.launch_server`, tests/fake_sglang serving the
  stand-in): its flags and device, a server that exits or never gets healthy, one that dies.
- The trainer through it: `grpo-edu train --set engine=sglang` against a server it starts, and
  2 processes (torchrun) training what 1 trains against one server.
"""

import base64
import importlib.util
import json
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_edu.environment import tasks
from grpo_edu.policy.models import STARTING_POLICY, load_policy
from grpo_edu.runtime.distributed import World
from grpo_edu.sampling import engines, fused_llama, sglang_engine
from grpo_edu.sampling.rollout import SamplingParams
from grpo_edu.sampling.sglang_engine import SGLangEngine, SGLangServerError, Settings
from freeze_sglang_api import freeze
from hang_guard import HANG_SECONDS
from sglang_standin import FROZEN, StandIn
from test_distributed import largest_difference

ROOT = Path(__file__).resolve().parents[1]
FAKE_SGLANG = ROOT / "tests" / "fake_sglang"
SOURCE = os.environ.get("GRPO_EDU_SGLANG_SOURCE")   # the pinned release: a wheel, or a folder holding sglang/
G, L, T = 4, 10, 0.7


def prompts(tokenizer, n=3):
    samples = tasks.make_dataset("arithmetic", n=n, split="test", seed=0)
    encoded = tokenizer([s["prompt"] for s in samples], return_tensors="pt", padding=True, add_special_tokens=False)
    return encoded["input_ids"], encoded["attention_mask"]


@pytest.fixture
def server():
    standin = StandIn()
    yield standin
    standin.close()


def engine_for(standin, tmp_path, policy=None, tokenizer=None, **settings):
    if policy is None:
        policy, tokenizer = load_policy(STARTING_POLICY)
    settings = Settings(url=standin.url if standin else "", output_dir=str(tmp_path), **settings)
    return SGLangEngine(str(STARTING_POLICY), policy, tokenizer, World(), settings, say=lambda m: None)


def routes(standin, since=0):
    return [route for _, route, _ in standin.calls[since:]]


def bodies(standin, route):
    return [body for _, r, body in standin.calls if r == route]


# ------------------------------------------------------------------ the API check

def test_every_name_the_engine_uses_is_in_sglang_0_5_23():
    assert FROZEN["sglang_version"] == sglang_engine.SGLANG_VERSION
    for route, (method, request_class, sent) in sglang_engine.ROUTES.items():
        spec = FROZEN["routes"][route]
        assert method in spec["methods"] and spec["body"] == request_class, (route, spec)
        if request_class:
            fields = FROZEN["requests"][request_class]["fields"]
            assert set(sent) <= set(fields), (route, sorted(set(sent) - set(fields)))
            assert set(FROZEN["requests"][request_class]["required"]) <= set(sent), route
    assert set(sglang_engine.SAMPLING_FIELDS) <= set(FROZEN["contract"]["SamplingParams"]["fields"])
    for name, fields in sglang_engine.READ.items():
        if name in FROZEN["contract"]:
            known = FROZEN["contract"][name]["fields"]
        elif name == "server_info":   # ServerArgs' fields and the route's own keys
            known = list(FROZEN["server_args"]) + FROZEN["responses"]["server_info"]
        elif name in FROZEN["responses"]:
            known = FROZEN["responses"][name]
        else:   # the update routes' answers: the output struct's fields, and the keys the route returns
            known = FROZEN["requests"][name]["fields"]
            route = {"UpdateWeightFromDiskReqOutput": "/update_weights_from_disk",
                     "UpdateWeightsFromTensorReqOutput": "/update_weights_from_tensor",
                     "BeginWeightUpdateReqOutput": "/begin_weight_update",
                     "EndWeightUpdateReqOutput": "/end_weight_update"}[name]
            assert set(fields) <= set(FROZEN["responses"][route]), name
        assert set(fields) <= set(known), (name, sorted(set(fields) - set(known)))
    assert FROZEN["contract"]["LogprobEntry"]["fields"][:2] == ["logprob", "token_id"]   # positional: the order counts
    for field, flag in sglang_engine.LAUNCH_FLAGS.items():
        assert FROZEN["server_args"][field] == flag, (field, FROZEN["server_args"].get(field))
    assert FROZEN["launch_server"]
    assert set(sglang_engine.MEMORY_TAGS) == set(FROZEN["memory_tags"].values())
    assert sglang_engine.EXTRA_STOP_TEXTS == tuple(FROZEN["protocol"]["stops"]["additional_stop_token_texts"]["texts"])
    assert {sglang_engine.RAW_LOGPROBS_VARIABLE, sglang_engine.CPU_ENGINE_VARIABLE} <= set(FROZEN["environment_variables"])
    assert FROZEN["serializer"] == {"pickler": "ForkingPickler", "base64": True}
    # what the engine relies on of SGLang's behaviour, as the source states it
    assert FROZEN["contract"]["SamplingParams"]["unknown_keys"] == "rejected"
    assert FROZEN["requests"]["GenerateReqInput"]["unknown_fields"] == "ignore"
    assert FROZEN["routes"]["/flush_cache"]["query"] == ["timeout"]


@pytest.mark.skipif(not SOURCE, reason="GRPO_EDU_SGLANG_SOURCE names no pinned sglang source (make test-sglang); "
                                       "the frozen file is checked above")
def test_the_frozen_file_is_what_the_pinned_source_says():
    assert freeze(SOURCE) == FROZEN, "SGLang's source changed: rerun tests/freeze_sglang_api.py and review the diff"


def _contract_module():
    """SGLang's own generated JSON contract, sglang/api/v1/api_types.py (it imports msgspec only)."""
    if not SOURCE or importlib.util.find_spec("msgspec") is None:
        return None
    source = Path(SOURCE)
    if source.is_dir():
        path = (source if (source / "sglang").is_dir() else source.parent) / "sglang/api/v1/api_types.py"
    else:
        import zipfile
        path = Path(os.environ.get("TMPDIR", "/tmp")) / "sglang_api_types.py"
        path.write_bytes(zipfile.ZipFile(source).read("sglang/api/v1/api_types.py"))
    spec = importlib.util.spec_from_file_location("sglang_api_types", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(_contract_module() is None, reason="needs the pinned source (GRPO_EDU_SGLANG_SOURCE) and msgspec "
                                                       "(make test-sglang)")
def test_sglangs_own_contract_takes_the_engines_requests_and_the_stand_ins_answers(server, tmp_path):
    contract = _contract_module()
    policy, tokenizer = load_policy(STARTING_POLICY)
    engine = engine_for(server, tmp_path, policy, tokenizer)
    engine.sync_weights()
    engine.generate(*prompts(tokenizer), SamplingParams(G, L, T), seeds=list(range(3 * G)))
    with pytest.raises(contract.JsonContractError, match="unknown field `seed`"):
        contract.GenerateRequest.from_json_value({"input_ids": [1], "sampling_params": {"seed": 1}})
    (body,) = bodies(server, "/generate")
    contract.GenerateRequest.from_json_value(body)
    status, answer = server.route_generate(body)   # the stand-in's answer to it, again
    assert status == 200
    for item in answer:
        decoded = contract.GenerateResponse.from_json_value(item)
        assert decoded.output_ids == item["output_ids"]
        assert [e.token_id for e in decoded.meta_info.output_token_logprobs] == item["output_ids"]


# ------------------------------------------------------------------ the stand-in's teeth

def test_the_stand_in_refuses_what_sglang_would_not_take(server):
    client = sglang_engine.Client(server.url, 10)
    client.call("POST", "/begin_weight_update", {})   # the allowlist's refusal below comes from inside a session
    refusals = {
        ("/generate", json.dumps({"input_ids": [[1, 2]], "sampling_params": {"seed": 3}})):
            "HTTP 400: unknown field `seed`, expected one of `max_new_tokens`",
        ("/generate", json.dumps({"input_ids": [[1, 2]], "seed": 3})):
            "HTTP 400: the stand-in refuses field(s) ['seed'] that SGLang 0.5.23's GenerateReqInput does not have",
        ("/update_weights_from_disk", json.dumps({"flush_cache": True})): "HTTP 422: ",
        ("/release_memory_occupation", json.dumps({"tags": ["gpu"]})): "HTTP 400: tags must be a list of",
        ("/update_weights_from_tensor", json.dumps({"serialized_named_tensors": [
            base64.b64encode(pickle.dumps(os.getcwd)).decode()]})):   # a callable SGLang's allowlist does not have
            "Blocked unsafe global (posix.getcwd)",
        ("/nowhere", "{}"): "HTTP 404",
    }
    for (route, body), message in refusals.items():
        with pytest.raises(SGLangServerError) as error:
            client.call("POST", route, json.loads(body))
        assert message in str(error.value), (route, str(error.value))
        assert "\n" not in str(error.value)
    with pytest.raises(SGLangServerError, match="HTTP 405"):
        client.call("GET", "/generate")
    client.call("POST", "/release_memory_occupation", {"tags": ["kv_cache"]})
    with pytest.raises(SGLangServerError, match=r"generate while \['kv_cache'\] are released"):
        client.call("POST", "/generate", {"input_ids": [[1, 2]]})


# ------------------------------------------------------------------ the state SGLang keeps (the frozen "protocol")

PROTOCOL = FROZEN["protocol"]


def test_the_weight_update_session_is_kept_as_sglang_keeps_it(server):
    """SGLang 0.5.23 (weight_updater.py, SchedulerWeightUpdaterManager): a tensor update outside a
    session, a second session, closing none are refused, each with SGLang's message and HTTP 400;
    a disk update, release and resume need no session. The stand-in answers so."""
    session = PROTOCOL["weight_update_session"]
    assert [session[c]["refused_when"] for c in ("update_weights_from_tensor", "begin_weight_update",
                                                 "end_weight_update")] == [
        "no session is open", "a session is open", "no session is open"]
    assert all(session[c]["refused_when"] is None for c in ("update_weights_from_disk", "release_memory_occupation",
                                                            "resume_memory_occupation"))
    # why: a disk update restores the weights for loading and post-processes them inside the call; a
    # tensor update does neither, the session's begin and end do (the model runner's WeightUpdater)
    runner = session["runner"]
    assert runner["update_weights_from_disk"]["calls"] == ["load_weights_and_postprocess",
                                                          "restore_weights_before_loading"]
    assert runner["update_weights_from_tensor"]["calls"] == []
    assert runner["begin_weight_update"]["calls"] == ["restore_weights_before_loading"]
    assert runner["end_weight_update"]["calls"] == ["postprocess_weights"]
    assert PROTOCOL["failure_status"] == {route: 400 for route in ("/begin_weight_update", "/end_weight_update",
                                                                   "/update_weights_from_tensor",
                                                                   "/update_weights_from_disk")}
    client = sglang_engine.Client(server.url, 10)

    def refused(route, body, call):
        with pytest.raises(SGLangServerError) as error:
            client.call("POST", route, body)
        assert str(error.value) == (f"SGLang server at {server.url}: POST {route} answered HTTP 400: "
                                    f"{session[call]['message']}")
    tensors = {"serialized_named_tensors": [sglang_engine.serialize_named_tensors([])]}
    refused("/update_weights_from_tensor", tensors, "update_weights_from_tensor")
    refused("/end_weight_update", {}, "end_weight_update")
    assert client.call("POST", "/begin_weight_update", {"selector": "all"})["success"] is True
    refused("/begin_weight_update", {"selector": "all"}, "begin_weight_update")
    assert client.call("POST", "/update_weights_from_tensor", tensors)["success"] is True
    assert client.call("POST", "/end_weight_update", {})["success"] is True
    refused("/end_weight_update", {}, "end_weight_update")
    answer = client.call("POST", "/update_weights_from_disk", {"model_path": str(STARTING_POLICY)})
    assert answer["success"] is True and server.session is None


def test_a_tensor_sync_opens_and_closes_the_session_as_sglangs_own_client_does(server, tmp_path):
    """/begin_weight_update with the body SGLang's HttpServerEngineAdapter sends ({"selector": ...}),
    every chunk, then /end_weight_update with {} (its empty payload); a disk sync opens none."""
    client = PROTOCOL["client"]
    assert client["begin_weight_update"]["body"] == ["selector"] and client["end_weight_update"]["body"] is None
    assert client["no_body_sent_as"] == "{}"
    engine = engine_for(server, tmp_path, weight_sync="tensor")
    start = len(server.calls)
    engine.sync_weights()
    calls = server.calls[start:]
    assert [route for _, route, _ in calls][0] == "/begin_weight_update"
    assert [route for _, route, _ in calls][-2:] == ["/end_weight_update", "/flush_cache"]
    assert {route for _, route, _ in calls[1:-2]} == {"/update_weights_from_tensor"}
    assert calls[0][2] == {"selector": "all"} and calls[-2][2] == {}
    assert server.session is None
    disk = engine_for(server, tmp_path, weight_sync="disk")
    start = len(server.calls)
    disk.sync_weights()
    assert routes(server, start) == ["/update_weights_from_disk", "/flush_cache"]


@pytest.mark.parametrize("call", ["/begin_weight_update", "/update_weights_from_tensor", "/end_weight_update"])
def test_a_failure_at_any_call_of_the_session_is_one_line_with_sglangs_message(server, tmp_path, call):
    """The run stops with one line naming the call and SGLang's message; after a failed update the
    session is closed all the same, so the server takes the next sync."""
    engine = engine_for(server, tmp_path, weight_sync="tensor")
    message = {"/begin_weight_update": PROTOCOL["weight_update_session"]["begin_weight_update"]["message"],
               "/update_weights_from_tensor": "Failed to update weights: injected.",
               "/end_weight_update": "injected end failure"}[call]
    if call == "/begin_weight_update":   # another client left a session open
        sglang_engine.Client(server.url, 10).call("POST", "/begin_weight_update", {})
    else:
        setattr(server, "route_" + call.strip("/"), lambda body: (400, {"success": False, "message": message}))
    with pytest.raises(SGLangServerError) as error:
        engine.sync_weights()
    assert str(error.value) == f"SGLang server at {server.url}: POST {call} answered HTTP 400: {message}"
    if call == "/update_weights_from_tensor":
        assert routes(server)[-1] == "/end_weight_update" and server.session is None


def test_memory_release_and_resume_follow_sglangs_scheduler(tmp_path):
    """SGLang 0.5.23 records released tags (none: all) whether or not it runs with
    --enable-memory-saver; a tag released twice stays released; a resume of a tag not released,
    or a release while a request runs, raises in its scheduler, whose handler ends the server:
    the request's connection drops and nothing answers after it."""
    memory = PROTOCOL["memory"]
    assert memory["no_tags_means"] == "GPU_MEMORY_ALL_TYPES" and memory["memory_saver_checked"] is False
    assert memory["release_records_tags"] and memory["resume_removes_each_tag"]
    assert memory["scheduler_exception_ends_the_server"]["signals_parent"]
    for saver in (True, False):
        standin = StandIn(memory_saver=saver)
        try:
            client = sglang_engine.Client(standin.url, 10)
            client.call("POST", "/release_memory_occupation", {})
            assert standin.offloaded == set(FROZEN["memory_tags"].values())
            client.call("POST", "/release_memory_occupation", {"tags": ["weights"]})
            client.call("POST", "/resume_memory_occupation", {"tags": ["weights"]})
            with pytest.raises(SGLangServerError, match="POST /resume_memory_occupation: the connection broke"):
                client.call("POST", "/resume_memory_occupation", {"tags": ["weights"]})
            assert standin.crashed == "KeyError: 'weights'"
            with pytest.raises(SGLangServerError, match="cannot connect"):
                client.call("GET", "/server_info")
        finally:
            standin.close()
    import threading
    standin = StandIn()
    try:
        running, finish = threading.Event(), threading.Event()
        answer = standin.route_generate
        standin.route_generate = lambda body: (running.set(), finish.wait(30), answer(body))[-1]
        client = sglang_engine.Client(standin.url, 30)
        outcome = []

        def generate():
            try:
                outcome.append(client.call("POST", "/generate", {"input_ids": [[5, 6]]}))
            except SGLangServerError as error:
                outcome.append(str(error))
        generating = threading.Thread(target=generate)
        generating.start()
        assert running.wait(30)
        with pytest.raises(SGLangServerError, match="POST /release_memory_occupation: the connection broke"):
            client.call("POST", "/release_memory_occupation", {})
        assert standin.crashed == f"AssertionError: {memory['release_requires_idle']['message']}"
        finish.set()
        generating.join(30)
        assert outcome == [f"SGLang server at {standin.url}: POST /generate: the connection broke (RemoteDisconnected: "
                           f"Remote end closed connection without response)"]
    finally:
        standin.close()


def test_a_launched_server_whose_scheduler_fails_is_one_line_with_its_log(fake_sglang, tmp_path):
    """A resume of a tag not released ends a server grpo-edu started as SGLang ends itself (killed,
    "Scheduler hit an exception" in its log): the engine's next call says so in one line."""
    engine = engine_for(None, tmp_path, device="cpu", start_timeout=120)
    try:
        with pytest.raises(SGLangServerError) as error:
            engine.client.call("POST", "/resume_memory_occupation", {"tags": ["kv_cache"]})
        engine.server.process.wait(timeout=30)
        assert str(error.value) == (f"the SGLang server grpo-edu started exited with code -9; the last line of its "
                                    f"log ({tmp_path / 'sglang_server.log'}): Scheduler hit an exception: KeyError: "
                                    f"'kv_cache'")
    finally:
        engine.close()


def test_the_stand_in_stops_where_sglang_does_and_the_engine_refuses_an_extra_stop(tmp_path):
    """SGLang ends a completion at the request's stop_token_ids, the model's EOS ids (config.json's
    and generation_config.json's: ModelConfig._get_hf_eos_token_id), the tokenizer's EOS and its
    added tokens among SGLang's extra stop texts. The engine sends the model's EOS ids itself, and
    refuses a tokenizer whose extra stop token the model's files do not name."""
    stops = PROTOCOL["stops"]
    assert stops["model_eos"]["reads"] == ["hf_config", "hf_generation_config"]
    assert stops["finish"]["token_in"] == ["sampling_params.stop_token_ids", "eos_token_ids", "tokenizer.eos_token_id",
                                           "tokenizer.additional_stop_token_ids"]
    import shutil
    model_dir = tmp_path / "model"
    shutil.copytree(STARTING_POLICY, model_dir)
    policy, tokenizer = load_policy(model_dir)
    think = tokenizer.convert_tokens_to_ids("</think>")
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "eos_token_id": [tokenizer.eos_token_id, think]}))
    standin = StandIn(model_dir)
    try:
        assert standin.eos == {tokenizer.eos_token_id, think}
        answer = sglang_engine.Client(standin.url, 10).call("POST", "/generate", {
            "input_ids": prompts(tokenizer, n=1)[0][0].tolist(), "sampling_params": {"max_new_tokens": 12,
                                                                                    "temperature": 0.0}})
        assert answer["output_ids"][-1] == think and answer["meta_info"]["finish_reason"] == {"type": "stop",
                                                                                              "matched": think}
    finally:
        standin.close()
    tokenizer.add_tokens(["<|eom_id|>"])
    eom = tokenizer.convert_tokens_to_ids("<|eom_id|>")
    with pytest.raises(ValueError) as error:
        sglang_engine.check_extra_stops(tokenizer, (tokenizer.eos_token_id,))
    assert str(error.value) == (f"engine = 'sglang': SGLang 0.5.23 also stops at the tokenizer's {{'<|eom_id|>': "
                                f"{eom}}}, which the model's files do not name as EOS (eos ids [1]): the other engines "
                                f"would go on there; add it to eos_token_id in the model's generation_config.json")
    sglang_engine.check_extra_stops(tokenizer, (tokenizer.eos_token_id, eom))


# ------------------------------------------------------------------ sampling

def test_a_rollout_is_one_request_of_seeded_rows_with_the_trainers_log_probs(server, tmp_path):
    """One /generate: the B x G rows prompt-major, each its own rid and sampling_seed, the whole
    softmax at T, EOS and the stop tokens; the answer's log-probs are the fused forward's."""
    policy, tokenizer = load_policy(STARTING_POLICY)
    ids, mask = prompts(tokenizer)
    engine = engine_for(server, tmp_path, policy, tokenizer)
    seeds = [100 + r for r in range(3 * G)]
    rollout = engine.generate(ids, mask, SamplingParams(G, L, T, stop_token_ids=(7,)), seeds=seeds)
    (body,) = bodies(server, "/generate")
    assert set(body) == {"rid", "input_ids", "sampling_params", "return_logprob"} and body["return_logprob"] is True
    assert body["input_ids"] == [ids[b][mask[b].bool()].tolist() for b in range(3) for _ in range(G)]
    assert len(set(body["rid"])) == 3 * G
    assert body["sampling_params"] == [{"max_new_tokens": L, "temperature": T, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
                                        "stop_token_ids": [tokenizer.eos_token_id, 7], "sampling_seed": s} for s in seeds]
    assert rollout.completion_ids.shape[0] == 3 * G and bool(rollout.finished.any())
    with torch.no_grad():
        fused = fused_llama.completion_logprobs(policy, torch.cat([rollout.prompt_ids, rollout.completion_ids], 1),
                                                torch.cat([rollout.prompt_mask, rollout.completion_mask.long()], 1),
                                                rollout.completion_mask, temperature=T, group_size=G)
    gap = (fused - rollout.sampler_logp)[rollout.completion_mask].abs().max()
    assert float(gap) < 1e-4, f"the server's log-probs differ from the trainer's by {float(gap):.2e}"


def test_a_completion_depends_on_its_seed_not_on_the_rest_of_the_batch(server, tmp_path):
    """Row r of the step samples with seed + r: asked in one request or in two (two ranks), the
    completions are the same; another seed gives others."""
    _, tokenizer = load_policy(STARTING_POLICY)
    ids, mask = prompts(tokenizer, n=4)
    engine = engine_for(server, tmp_path)
    sampling = SamplingParams(G, L, 1.0)
    torch.manual_seed(5)
    seeded = engine.seeded(4 * G, L, World())
    whole = seeded(0, ids, mask, sampling, torch.arange(4 * G))
    first = seeded(0, ids[:2], mask[:2], sampling, torch.arange(2 * G))
    second = seeded(0, ids[2:], mask[2:], sampling, torch.arange(2 * G, 4 * G))
    for part, rows in ((first, slice(0, 2 * G)), (second, slice(2 * G, 4 * G))):
        S = part.completion_ids.shape[1]
        assert torch.equal(part.completion_ids, whole.completion_ids[rows, :S])
        assert torch.equal(part.sampler_logp, whole.sampler_logp[rows, :S])
    torch.manual_seed(6)
    other = engine.seeded(4 * G, L, World())(0, ids, mask, sampling, torch.arange(4 * G))
    assert not torch.equal(other.completion_ids, whole.completion_ids)


def test_sglang_deterministic_false_sends_no_seeds_and_a_server_without_it_is_refused(tmp_path):
    """sglang_deterministic: true needs a server started with --enable-deterministic-inference
    (one line, naming the key); false sends one sampling_params for all rows, without a seed."""
    standin = StandIn(deterministic=False)
    try:
        with pytest.raises(SGLangServerError) as error:
            engine_for(standin, tmp_path)
        assert str(error.value) == (f"config key 'sglang_deterministic' is true, but the SGLang server at {standin.url} "
                                    f"was started without --enable-deterministic-inference: restart it with the flag, "
                                    f"or set sglang_deterministic = false")
        policy, tokenizer = load_policy(STARTING_POLICY)
        engine = engine_for(standin, tmp_path, policy, tokenizer, deterministic=False)
        ids, mask = prompts(tokenizer, n=1)
        first = engine.generate(ids, mask, SamplingParams(G, L, 1.0), seeds=[1, 2, 3, 4])
        again = engine.generate(ids, mask, SamplingParams(G, L, 1.0), seeds=[1, 2, 3, 4])
        body = bodies(standin, "/generate")[0]
        assert isinstance(body["sampling_params"], dict) and "sampling_seed" not in body["sampling_params"]
        assert not torch.equal(first.completion_ids, again.completion_ids), "the server's own random state moves on"
    finally:
        standin.close()


# ------------------------------------------------------------------ weight sync

@pytest.mark.parametrize("how", ["disk", "tensor"])
def test_a_weight_sync_changes_what_the_server_samples(tmp_path, monkeypatch, how):
    """The trainer's weights reach the server (a safetensors folder, or SGLang's serialized
    tensors, unpickled under its allowlist, one payload per tensor-parallel rank, in chunks),
    tagged with a weight version every answer carries; the prefix cache is flushed once after."""
    standin = StandIn(tp_size=2)
    try:
        policy, tokenizer = load_policy(STARTING_POLICY)
        ids, mask = prompts(tokenizer)
        monkeypatch.setattr(sglang_engine, "TENSOR_REQUEST_BYTES", 200_000)   # several requests
        monkeypatch.setattr(sglang_engine, "DISK_SHARD_BYTES", 200_000)      # several files
        engine = engine_for(standin, tmp_path, policy, tokenizer, weight_sync=how)
        sampling = SamplingParams(G, L, T)
        before = engine.generate(ids, mask, sampling, seeds=list(range(3 * G)))
        with torch.no_grad():
            policy.lm_head.weight.mul_(3.0)
        start = len(standin.calls)
        engine.sync_weights()
        after = engine.generate(ids, mask, sampling, seeds=list(range(3 * G)))
        update = f"/update_weights_from_{how}"
        sent = bodies(standin, update)
        session = (["/begin_weight_update"], ["/end_weight_update"]) if how == "tensor" else ([], [])
        assert routes(standin, start) == session[0] + [update] * len(sent) + session[1] + ["/flush_cache", "/generate"]
        assert all(b["flush_cache"] is False and b["weight_version"] == engine.version for b in sent)
        assert engine.version.startswith("grpo-edu-") and standin.weight_version == engine.version
        if how == "tensor":
            assert len(sent) > 1 and all(len(b["serialized_named_tensors"]) == 2 for b in sent)
        else:
            (body,) = sent
            assert body["model_path"] == str((tmp_path / "sglang_weights").resolve())
            assert len(list((tmp_path / "sglang_weights").glob("model-*.safetensors"))) > 1
            assert (tmp_path / "sglang_weights" / "config.json").is_file()
        served = dict(standin.model.named_parameters())
        assert all(torch.equal(served[name], p) for name, p in policy.named_parameters())
        full = torch.cat([after.prompt_ids, after.completion_ids], 1)
        attention = torch.cat([after.prompt_mask, after.completion_mask.long()], 1)
        with torch.no_grad():
            new = fused_llama.completion_logprobs(policy, full, attention, after.completion_mask, temperature=T)
        assert float((new - after.sampler_logp)[after.completion_mask].abs().max()) < 1e-4
        assert not torch.equal(before.sampler_logp, after.sampler_logp)
        # another client changes the weights: the next answer carries another version, and is refused
        sglang_engine.Client(standin.url, 10).call("POST", "/update_weights_from_disk", {
            "model_path": str(STARTING_POLICY), "weight_version": "someone-else"})
        with pytest.raises(SGLangServerError, match="sampled with the weights 'someone-else', but the trainer's last "
                                                    "sync was 'grpo-edu-"):
            engine.generate(ids, mask, sampling, seeds=list(range(3 * G)))
    finally:
        standin.close()


def test_sleep_releases_the_servers_memory_around_the_update(server, tmp_path):
    """sglang_sleep: released at start and after every rollout; a sync takes the weights back,
    loads, flushes, then takes back the KV cache and CUDA graphs. A generate while released is
    refused by the engine; a server without --enable-memory-saver is refused at start."""
    policy, tokenizer = load_policy(STARTING_POLICY)
    ids, mask = prompts(tokenizer)
    engine = engine_for(server, tmp_path, policy, tokenizer, sleep=True)
    start = len(server.calls)
    assert routes(server)[-1] == "/release_memory_occupation" and server.offloaded == set(sglang_engine.MEMORY_TAGS)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="the server's memory is released \\(sglang_sleep\\): call sync_weights"):
            engine.generate(ids, mask, SamplingParams(G, L, T), seeds=list(range(3 * G)))
        engine.sync_weights()
        engine.generate(ids, mask, SamplingParams(G, L, T), seeds=list(range(3 * G)))
    one = ["/resume_memory_occupation", "/update_weights_from_disk", "/flush_cache", "/resume_memory_occupation",
           "/generate", "/release_memory_occupation"]
    assert routes(server, start) == one * 2
    tags = [body["tags"] for _, route, body in server.calls[start:start + 6] if "memory" in route]
    assert tags == [["weights"], ["kv_cache", "cuda_graph"], ["weights", "kv_cache", "cuda_graph"]]
    plain = StandIn(memory_saver=False)
    try:
        with pytest.raises(SGLangServerError, match="config key 'sglang_sleep' is true, but the SGLang server at .* was "
                                                    "started without --enable-memory-saver"):
            engine_for(plain, tmp_path, sleep=True)
    finally:
        plain.close()


# ------------------------------------------------------------------ failures: one line each

@pytest.mark.parametrize("fault, message", [
    (None, "SGLang server at http://127.0.0.1:{port}: GET /server_info: cannot connect ("),
    ("http500", "POST /generate answered HTTP 500: Internal Server Error (injected)"),
    ("not_json", "POST /generate answered with a body that is not JSON: '<html>not json</html>'"),
    ("slow:3", "POST /generate: no answer within 0.5 s (config key sglang_timeout)"),
    ("drop", "POST /generate: the connection broke (RemoteDisconnected: "),
    ("empty", "POST /generate answered a list of 0, expected a list of 4 completions"),
    ("no_logprobs", "meta_info.output_token_logprobs must hold [logprob, token_id, text] for each of the"),
])
def test_a_server_that_is_absent_fails_or_answers_badly_is_one_line(server, tmp_path, fault, message):
    policy, tokenizer = load_policy(STARTING_POLICY)
    ids, mask = prompts(tokenizer, n=1)
    if fault is None:   # nothing listens there any more
        port = server.url.rsplit(":", 1)[1]
        server.close()
        with pytest.raises(SGLangServerError) as error:
            engine_for(server, tmp_path, policy, tokenizer)
        message = message.format(port=port)
    else:
        engine = engine_for(server, tmp_path, policy, tokenizer, timeout=0.5)
        if fault == "empty":
            server.route_generate = lambda body: (200, [])
        elif fault == "no_logprobs":
            answer = server.route_generate
            server.route_generate = lambda body: answer({**body, "return_logprob": False})
        else:
            server.fault("/generate", fault)
        with pytest.raises(SGLangServerError) as error:
            engine.generate(ids, mask, SamplingParams(G, L, T), seeds=list(range(G)))
    assert message in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_grpo_edu_train_against_no_server_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "grpo_edu", "train", "--set", "engine=sglang", "--set", "steps=1",
                           "--set", "sglang_url='http://127.0.0.1:9'", "--set", f"output_dir={tmp_path / 'run'}",
                           "--set", "progress=false"], capture_output=True, text=True, cwd=tmp_path,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, timeout=HANG_SECONDS)
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "grpo-edu train: SGLang server at http://127.0.0.1:9: GET /server_info: cannot connect ([Errno 111] Connection "
        "refused); start the server or fix config key sglang_url ('' starts one)")


# ------------------------------------------------------------------ the config keys

def test_every_sglang_key_reaches_the_engine_and_its_own_rules_are_one_line(tmp_path, monkeypatch):
    """placement.make_engine hands each sglang_* key to the engine (the tests above show what each
    does there); a malformed address or device is one line naming the key."""
    from grpo_edu.training import placement
    from grpo_edu.config import TrainConfig
    from test_trainer import small_config
    built = []
    monkeypatch.setattr(sglang_engine, "SGLangEngine", lambda path, policy, tokenizer, world, settings: built.append(
        (path, settings)))
    config = small_config(tmp_path, engine="sglang", sglang_url="http://127.0.0.1:31000", sglang_device="cuda:2",
                          sglang_mem_fraction_static=0.55, sglang_weight_sync="tensor", sglang_sleep=True,
                          sglang_deterministic=False, sglang_timeout=12.0, sglang_start_timeout=34.0, seed=9)
    policy, tokenizer = load_policy(STARTING_POLICY)
    placement.make_engine(config, placement.build_models(config, World(), policy), tokenizer)
    ((path, settings),) = built
    assert path == str(STARTING_POLICY)
    assert settings == Settings(url="http://127.0.0.1:31000", device="cuda:2", mem_fraction_static=0.55,
                                weight_sync="tensor", sleep=True, deterministic=False, timeout=12.0, start_timeout=34.0,
                                dtype="float32", seed=9, output_dir=config.logging.output_dir)
    for key, value, message in (
            ("sglang_url", "127.0.0.1:30000", "config key 'sglang_url' must be '' (grpo-edu starts a server) or a "
                                              "server's address such as 'http://127.0.0.1:30000', got '127.0.0.1:30000'"),
            ("sglang_device", "gpu1", "config key 'sglang_device' must be 'cuda' (the trainer's GPU), 'cuda:N' (GPU N) "
                                      "or 'cpu', got 'gpu1'"),
            ("sglang_weight_sync", "nccl", "config key 'sglang_weight_sync' must be one of ('disk', 'tensor'), got "
                                           "'nccl'"),
            ("sglang_timeout", 0.0, "config key 'sglang_timeout' must be > 0, got 0.0")):
        with pytest.raises(ValueError) as error:
            TrainConfig(**{key: value})
        assert str(error.value) == message
    assert engines.on_this_machine("") and engines.on_this_machine("http://localhost:1")
    assert engines.on_this_machine("http://[::1]:30000") and not engines.on_this_machine("http://node7:1")


# ------------------------------------------------------------------ starting the server

def test_the_launch_command_names_the_device_and_the_settings(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    monkeypatch.setenv(sglang_engine.RAW_LOGPROBS_VARIABLE, "1")
    cases = {("cuda:1", torch.device("cuda", 0)): ("cuda", "5"), ("cuda", torch.device("cuda", 1)): ("cuda", "5"),
             ("cuda", torch.device("cpu")): ("cuda", "4"), ("cpu", torch.device("cpu")): ("cpu", "4,5")}
    for (device, trainer), (kind, visible) in cases.items():
        settings = Settings(device=device, mem_fraction_static=0.25, sleep=device == "cpu", deterministic=device != "cpu",
                            dtype="bfloat16", seed=7)
        argv, environment = sglang_engine.launch_command("/models/tiny", 31234, settings, trainer)
        assert argv[:3] == [sys.executable, "-m", "sglang.launch_server"]
        assert argv[3:17] == ["--model-path", "/models/tiny", "--host", "127.0.0.1", "--port", "31234", "--device",
                              kind, "--dtype", "bfloat16", "--mem-fraction-static", "0.25", "--random-seed", "7"]
        assert argv[17:] == (["--enable-memory-saver"] if device == "cpu" else ["--enable-deterministic-inference"])
        assert environment["CUDA_VISIBLE_DEVICES"] == visible
        assert environment.get(sglang_engine.CPU_ENGINE_VARIABLE) == ("1" if kind == "cpu" else None)
        assert sglang_engine.RAW_LOGPROBS_VARIABLE not in environment


@pytest.fixture
def fake_sglang(monkeypatch, tmp_path):
    """`python -m sglang.launch_server` serves the stand-in (here and in child processes)."""
    monkeypatch.syspath_prepend(str(FAKE_SGLANG))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAKE_SGLANG), str(ROOT / "tests"), str(ROOT)]))
    log = tmp_path / "launched.jsonl"
    monkeypatch.setenv("FAKE_SGLANG_LOG", str(log))
    return log


def test_a_started_server_that_exits_never_gets_healthy_or_dies_is_one_line(fake_sglang, tmp_path, monkeypatch):
    settings = dict(device="cpu", start_timeout=1.5)
    monkeypatch.setenv("FAKE_SGLANG_EXIT", "3")
    with pytest.raises(SGLangServerError) as error:
        engine_for(None, tmp_path, **settings)
    assert str(error.value) == (f"the SGLang server grpo-edu started exited with code 3; the last line of its log "
                                f"({tmp_path / 'sglang_server.log'}): RuntimeError: the fake server was told to fail "
                                f"at start-up")
    monkeypatch.delenv("FAKE_SGLANG_EXIT")
    with pytest.raises(SGLangServerError) as error:   # not yet listening after 1.5 s (it imports torch first)
        engine_for(None, tmp_path, **settings)
    assert str(error.value) == (f"the SGLang server grpo-edu started did not answer /health_generate within 1.5 s "
                                f"(config key sglang_start_timeout); last: cannot connect ([Errno 111] Connection "
                                f"refused); its log: {tmp_path / 'sglang_server.log'}")
    monkeypatch.setenv("FAKE_SGLANG_STARTING", "1")   # then 503 for a second: the engine waits through it
    policy, tokenizer = load_policy(STARTING_POLICY)
    engine = engine_for(None, tmp_path, policy, tokenizer, device="cpu", start_timeout=120)
    polls = [line for line in fake_sglang.read_text().splitlines() if "/health_generate" in line]
    assert len(polls) > 2 and "/server_info" in fake_sglang.read_text()
    try:
        engine.sync_weights()
        os.killpg(engine.server.process.pid, signal.SIGKILL)
        engine.server.process.wait(timeout=30)
        with pytest.raises(SGLangServerError, match="the SGLang server grpo-edu started exited with code -9"):
            engine.generate(*prompts(tokenizer, n=1), SamplingParams(G, L, T), seeds=list(range(G)))
    finally:
        engine.close()


def short_completions(completions, **kwargs) -> list[float]:
    """A reward GRPO moves within a few steps: minus the completion's length (in tens of characters)."""
    from grpo_edu.environment.rewards import completion_text
    return [-len(completion_text(c)) / 10.0 for c in completions]


def test_training_through_the_server_improves_as_training_with_the_fused_engine_does(server, tmp_path):
    """8 steps towards short completions (learning rate 3e-3): through the SGLang server the reward
    climbs from about -2.9 to about -0.1, as with the fused engine on the same seed (the samples
    differ: each engine draws its own); every step trains on-policy (sampler gap ~1e-7)."""
    from grpo_edu.training import trainer
    from test_trainer import small_config
    curves = {}
    for engine in ("fused", "sglang"):
        server_only = {"sglang_url": server.url} if engine == "sglang" else {}
        config = small_config(tmp_path / engine, steps=8, max_completion_length=12, eval_size=4, eval_every=1000,
                              checkpoint_every=0, learning_rate=3e-3, beta=0.0, engine=engine,
                              rewards={"test_sglang_engine:short_completions": 1.0}, **server_only)
        history = trainer.train(config, log=lambda _: None).history
        curves[engine] = [m["reward/mean"] for m in history]
        if engine == "sglang":
            assert max(m["sampler_gap/mean_abs"] for m in history) < 1e-5
    first, last = (sum(curves["sglang"][:2]) / 2, sum(curves["sglang"][-2:]) / 2)
    assert last - first > 1.5, curves
    assert last >= sum(curves["fused"][-2:]) / 2 - 0.3, curves


SETTINGS = ["steps=3", "prompts_per_step=4", "num_generations=4", "max_completion_length=8", "eval_size=16",
            "eval_every=1000", "checkpoint_every=3", "progress=false", "threads=1", "engine=sglang"]


def train(arguments: list[str], processes: int, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    prefix = [sys.executable] if processes == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    env = {k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    done = subprocess.run(prefix + ["-m", "grpo_edu", "train", *[f"--set={s}" for s in arguments]], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=HANG_SECONDS)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def test_grpo_edu_train_starts_the_server_syncs_sleeps_and_stops_it(fake_sglang, tmp_path, monkeypatch):
    """`grpo-edu train --set engine=sglang` with sglang_url = '': rank 0 starts the server with
    the run's flags (a CPU device, memory saver, deterministic inference, float32), syncs the
    weights as tensors before every rollout, lets the server sleep around every update, logs a
    sampler gap of float32 rounding, and stops the server at the end."""
    monkeypatch.setenv(sglang_engine.RAW_LOGPROBS_VARIABLE, "1")   # never reaches the server
    out = tmp_path / "run"
    train(SETTINGS + [f"output_dir={out}", "sglang_device=cpu", "sglang_weight_sync=tensor", "sglang_sleep=true",
                      "sglang_mem_fraction_static=0.2", "seed=3"], 1, tmp_path, dict(os.environ, OMP_NUM_THREADS="1"))
    lines = [json.loads(line) for line in fake_sglang.read_text().splitlines()]
    launched = lines[0]
    assert launched["argv"][:2] == ["--model-path", str(STARTING_POLICY)]
    flags = " ".join(launched["argv"][4:])
    assert flags.endswith("--device cpu --dtype float32 --mem-fraction-static 0.2 --random-seed 3 "
                          "--enable-memory-saver --enable-deterministic-inference")
    assert launched["SGLANG_USE_CPU_ENGINE"] == "1" and launched["SGLANG_RETURN_ORIGINAL_LOGPROB"] is None
    calls = [route for _, route, _ in lines[1:] if route != "/health_generate"]
    cycle = ["/resume_memory_occupation", "/begin_weight_update", "/update_weights_from_tensor", "/end_weight_update",
             "/flush_cache", "/resume_memory_occupation", "/generate", "/release_memory_occupation"]
    assert calls == ["/server_info", "/model_info", "/release_memory_occupation"] + cycle * 3
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["sampler_gap/mean_abs"] < 1e-5 for m in metrics)
    port = int(launched["argv"][launched["argv"].index("--port") + 1])
    with pytest.raises(SGLangServerError, match="cannot connect"):   # stopped with the run
        sglang_engine.Client(f"http://127.0.0.1:{port}", 5).call("GET", "/health")


def test_two_processes_train_through_one_server_what_one_does(tmp_path):
    """torchrun, 2 ranks under fsdp2, one running server (sglang_url): rank 0 writes the weights
    (gathered from the shards on both ranks) and has the server load them, every rank sends its
    own prompts, each row seeded by its index in the step; the 2-process run trains what the
    1-process run does. (The tensor sync crosses processes in the test above.)"""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # the stand-in in this process: its idle OpenMP threads would spin beside the ranks
    standin = StandIn()
    try:
        settings = SETTINGS + [f"sglang_url='{standin.url}'", "parallelism=fsdp2", "sglang_weight_sync=disk", "steps=2",
                               "eval_size=4"]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        for processes in (1, 2):
            start = len(standin.calls)
            train(settings + [f"output_dir={tmp_path / str(processes)}"], processes, tmp_path, env)
            calls = routes(standin, start)
            assert calls.count("/update_weights_from_disk") == 2 and calls.count("/flush_cache") == 2
            assert calls.count("/generate") == 2 * processes   # each rank its own prompts
            assert calls.count("/server_info") == 1   # rank 0 alone connects
    finally:
        standin.close()
        torch.set_num_threads(threads)
    rewards = [[json.loads(line)["reward/mean"] for line in (tmp_path / str(p) / "metrics.jsonl").read_text().splitlines()]
               for p in (1, 2)]
    assert rewards[0] == rewards[1]
    assert largest_difference(tmp_path / "1", tmp_path / "2") < 1e-5
