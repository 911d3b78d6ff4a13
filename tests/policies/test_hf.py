import sys

import pytest

from trace_gym import Job, Ledger, RolloutRunner, SamplingParams, message
from trace_gym.errors import ConfigError, MissingDependencyError
from trace_gym.policies import HFPolicy, make_tiny_model  # lazy: importing needs no torch
from trace_gym.types import GenerationRequest

pytest.importorskip("transformers", reason="needs the hf extra: pip install 'trace-gym[hf]'")
torch = pytest.importorskip("torch", reason="needs the hf extra: pip install 'trace-gym[hf]'")

TOOLS = (
    {
        "type": "function",
        "function": {"name": "advance", "parameters": {"type": "object", "properties": {}}},
    },
)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny():
    return make_tiny_model(seed=0)


@pytest.fixture
def policy(tiny):
    model, tokenizer = tiny
    return HFPolicy(model, tokenizer, device="cpu")


def _request(text="Take three steps, then answer.", *, n=1, seed=7, **kw):
    kw.setdefault("max_new_tokens", 8)
    return GenerationRequest((message("user", text),), n=n, seed=seed, tools=TOOLS, **kw)


def _ids(samples):
    return [g.completion_token_ids for g in samples]


def test_samples_differ_and_each_is_reproducible_whatever_the_batch(policy):
    alone = policy.generate([_request(n=3)])[0]
    assert len(set(_ids(alone))) == 3
    batch = policy.generate(
        [_request("hi", n=2, seed=1), _request(n=3), _request("a longer one " * 9, seed=2)]
    )
    assert _ids(batch[1]) == _ids(alone)
    flat = [lp for g in batch[1] for lp in g.logprobs or ()]
    assert flat == pytest.approx([lp for g in alone for lp in g.logprobs or ()], abs=1e-5)
    assert policy.generate([_request(n=3, seed=8)])[0] != alone


def test_greedy_is_deterministic_across_seeds(policy):
    a = policy.generate([_request(n=2, temperature=0.0, seed=1)])[0]
    b = policy.generate([_request(temperature=0.0, seed=99)])[0]
    assert a[0].completion_token_ids == a[1].completion_token_ids == b[0].completion_token_ids


def test_logprobs_match_a_full_forward_pass(tiny, policy):
    model, _ = tiny
    for g in policy.generate([_request(n=2, top_p=0.9, temperature=0.7)])[0]:
        assert g.prompt_token_ids is not None and g.completion_token_ids is not None
        assert (
            g.logprobs is not None and len(g.logprobs) == len(g.completion_token_ids) == g.completion_tokens
        )
        ids = torch.tensor([g.prompt_token_ids + g.completion_token_ids])
        with torch.inference_mode():
            logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
        start = len(g.prompt_token_ids) - 1
        expected = [float(logp[start + k, t]) for k, t in enumerate(g.completion_token_ids)]
        assert g.logprobs == pytest.approx(expected, abs=1e-4)
        assert g.prompt_tokens == len(g.prompt_token_ids)


def test_max_new_tokens_gives_length(policy):
    samples = policy.generate([_request(n=2, max_new_tokens=5)])[0]
    assert all(g.finish_reason == "length" and g.completion_tokens == 5 for g in samples)


def test_stop_string_cuts_after_it(policy):
    free = policy.generate([_request(max_new_tokens=12)])[0][0]
    stop = free.text[3:6]  # a string the sampled text contains (the same seed repeats it)
    assert len(stop) == 3
    [g] = policy.generate([_request(max_new_tokens=12, stop=("never seen", stop))])[0]
    assert g.finish_reason == "stop"
    assert g.text == free.text[: free.text.find(stop) + 3]
    assert g.completion_token_ids == free.completion_token_ids[: len(g.completion_token_ids)]
    assert len(g.logprobs or ()) == len(g.completion_token_ids or ())


def test_eos_ends_with_stop_and_is_not_in_the_text(tiny):
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer, device="cpu")
    policy.eos_token_ids = frozenset(range(len(tokenizer)))  # every token ends the turn
    [g] = policy.generate([_request()])[0]
    assert g.finish_reason == "stop" and g.text == "" and len(g.completion_token_ids or ()) == 1


def test_n_samples_share_one_prefill(policy):
    long_text = "Take three steps, then answer. " * 20
    [[first]] = policy.generate([_request(long_text, max_new_tokens=2)])
    prompt = len(first.prompt_token_ids or ())
    assert prompt > 100
    before = policy.prefill_tokens
    policy.generate([_request(long_text, n=4, max_new_tokens=2)])
    shared = policy.prefill_tokens - before
    before = policy.prefill_tokens
    policy.generate([_request(long_text, seed=s, max_new_tokens=2) for s in range(4)])
    separate = policy.prefill_tokens - before
    assert (shared, separate) == (prompt, 4 * prompt)


def test_a_big_n_is_decoded_in_chunks_from_one_prefill(tiny):
    model, tokenizer = tiny
    small = HFPolicy(model, tokenizer, device="cpu", max_batch_size=2)
    wide = HFPolicy(model, tokenizer, device="cpu", max_batch_size=16)
    chunked = small.generate([_request(n=5)])[0]
    assert _ids(chunked) == _ids(wide.generate([_request(n=5)])[0])
    assert small.prefill_tokens == chunked[0].prompt_tokens


def test_overflow_error_fails_only_that_request(tiny):
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer, device="cpu", context_window=200, overflow="error")
    short, long_ = _request("hi"), _request("go on " * 200, n=2)
    out = policy.generate([short, long_, short])
    assert [g.failed for g in out[1]] == [True, True]
    assert "exceeds the context window of 200" in (out[1][0].error or "")
    assert not out[0][0].failed and not out[2][0].failed
    assert policy.last_truncated == []


def test_overflow_truncate_left_drops_old_messages(tiny, caplog):
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer, device="cpu", context_window=300)
    history = (
        message("system", "Be brief."),
        message("user", "old " * 300),
        message("assistant", "ok"),
        message("user", "Now answer."),
    )
    request = GenerationRequest(history, seed=3, max_new_tokens=8, tools=TOOLS)
    out = policy.generate([_request("hi"), request])
    assert not out[1][0].failed and policy.last_truncated == [1]
    assert out[1][0].prompt_tokens + 8 <= 300
    text = tokenizer.decode(out[1][0].prompt_token_ids)
    assert text.startswith("<|im_start|>system\nBe brief.") and "Now answer." in text and "old" not in text
    assert "truncated" in caplog.text


def test_template_without_tools_gets_a_system_message(tiny):
    model, _ = tiny
    plain = make_tiny_model()[1]
    plain.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    policy = HFPolicy(model, plain, device="cpu")
    assert not policy.supports_tools
    text = policy.render([message("user", "go")], TOOLS)
    assert text.startswith("<|im_start|>system\n# Tools") and '"name": "advance"' in text


def test_runner_records_token_ids_and_logprobs_on_every_node(tiny):
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer, device="cpu")
    ledger = Ledger()
    with RolloutRunner(
        "trace_gym/SyntheticTree-v0",
        policy,
        seed=0,
        sampling=SamplingParams(max_new_tokens=16),
        env_kwargs={"num_tasks": 4, "min_steps": 1, "max_steps": 1, "extra_turns": 1},  # 2 turns at most
    ) as runner:
        trees = runner.run([Job(runner.tasks[0], 3), Job(runner.tasks[1], 2)], ledger)
    nodes = [n for tree in trees for n in tree.nodes if n.generated]
    assert sum(1 for tree in trees for _ in tree.leaves()) == 5
    for node in nodes:
        assert not node.failed, node.error
        assert node.completion_token_ids is not None and node.prompt_token_ids is not None
        assert node.logprobs is not None and len(node.logprobs) == len(node.completion_token_ids)
        assert node.prompt_tokens == len(node.prompt_token_ids)
    assert Ledger.from_trees(trees).counts() == ledger.counts()


def test_missing_path_and_missing_extra_are_explained(monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match="No model directory"):
        HFPolicy.from_pretrained(tmp_path / "nope")
    with pytest.raises(ConfigError, match="local_files_only=True"):
        HFPolicy.from_pretrained("no-such-org/no-such-model-xyz")
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'trace-gym\[hf\]'"):
        HFPolicy.from_pretrained("anything")


def test_from_pretrained_loads_a_saved_model(tiny, tmp_path):
    model, tokenizer = tiny
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = HFPolicy.from_pretrained(tmp_path, device="cpu")
    reference = HFPolicy(model, tokenizer, device="cpu")
    request = _request(temperature=0.0)
    assert _ids(loaded.generate([request])[0]) == _ids(reference.generate([request])[0])


def test_bad_settings_are_refused(tiny):
    model, tokenizer = tiny
    with pytest.raises(ConfigError, match="overflow must be"):
        HFPolicy(model, tokenizer, overflow="drop")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_batch_size must be >= 1"):
        HFPolicy(model, tokenizer, max_batch_size=0)
