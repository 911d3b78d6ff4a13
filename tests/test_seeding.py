import numpy as np

from trace_gym.seeding import mix, splitmix64, stream, unit


def test_splitmix64_matches_reference_values():
    # First outputs of the reference SplitMix64 generator seeded with 0.
    state, outputs = 0, []
    for _ in range(3):
        outputs.append(splitmix64(state))
        state += 0x9E3779B97F4A7C15
    assert outputs == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def test_stream_is_the_splitmix_sequence():
    assert [stream(0, k) for k in range(3)] == [
        0xE220A8397B1DCDAF,
        0x6E789E6AA1B965F4,
        0x06C45D188009454F,
    ]


def test_mix_depends_on_order_and_values():
    assert mix(1, 2) != mix(2, 1)
    assert mix(1, 2) == mix(1, 2)
    assert len({mix(0, i) for i in range(1000)}) == 1000


def test_unit_is_uniform_in_unit_interval():
    u = np.array([unit(stream(123, k)) for k in range(20000)])
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01
    assert abs(np.mean(u < 0.1) - 0.1) < 0.01
