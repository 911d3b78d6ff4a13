import pytest

from trace_gym import GenerationRequest, SimulatedPolicy, message
from trace_gym.envs.synthetic import _parse_draw


def _request(seed, n=1):
    return GenerationRequest((message("user", "go"),), n=n, seed=seed)


def test_same_seed_same_samples_whatever_the_batch():
    policy = SimulatedPolicy()
    alone = policy.generate([_request(5, 3)])[0]
    batched = policy.generate([_request(1), _request(5, 3), _request(9, 2)])[1]
    assert [g.text for g in alone] == [g.text for g in batched]


def test_siblings_differ_and_parse_as_draws():
    samples = SimulatedPolicy().generate([_request(2, 50)])[0]
    draws = [_parse_draw(g.text) for g in samples]
    assert all(isinstance(d, float) and 0 <= d < 1 for d in draws)
    assert len(set(draws)) == 50


def test_draws_are_uniform():
    samples = SimulatedPolicy().generate([_request(s) for s in range(4000)])
    draws = [_parse_draw(g[0].text) for g in samples]
    assert abs(sum(d < 0.25 for d in draws) / 4000 - 0.25) < 0.03  # type: ignore[operator]


def test_token_counts_are_reported():
    [[g]] = SimulatedPolicy().generate([_request(1)])
    assert g.finish_reason == "stop" and g.prompt_tokens > 0 and g.completion_tokens > 0


def test_a_request_without_seed_is_refused():
    with pytest.raises(ValueError, match=r"needs GenerationRequest\.seed"):
        SimulatedPolicy().generate([GenerationRequest((message("user", "go"),))])
