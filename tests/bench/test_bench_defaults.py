"""The defaults benchmark's report (bench/bench_defaults.py): every round counted, the
ratios taken within a round, the options naming each topic."""

from __future__ import annotations

from bench.bench_defaults import report, spread, topic_options


def test_topic_options_name_each_topic_by_its_kind():
    options = topic_options({"events": "ev", "sel": "out", "dlq": "dead"})
    assert options == ["--events-topic", "ev", "--selections-topic", "out", "--dlq-topic", "dead"]


def test_spread_is_the_median_and_the_range_of_every_run():
    assert spread([3.0, 1.0, 2.0, 10.0]) == "2.50 (1.00 - 10.00)"


def test_the_report_takes_every_round_and_each_round_s_own_ratio():
    def run(ref, defaults, plain):
        service = {"fixed_s": 1.0, "cpu_s": 2.0, "serving_cpu_s": 1.0, "dead_letters": 0}
        return {
            "reference": {"events_per_s": ref},
            "defaults": {**service, "events_per_s": defaults},
            "no_changelog": {**service, "events_per_s": plain},
            "shards_32": {**service, "events_per_s": plain},
            "ratios": {
                "reference": defaults / ref,
                "no_changelog": defaults / plain,
                "cpu_per_event_vs_32": 1.0,
            },
        }

    rounds = [run(100.0, 50.0, 60.0), run(200.0, 180.0, 200.0), run(100.0, 70.0, 70.0)]
    text = report({"command": "c", "machine": "m", "throughput": {"events topic": rounds}})
    row = next(line for line in text.splitlines() if line.startswith("| events topic"))
    # the rounds' own ratios 0.5, 0.9 and 0.7, their median and range
    assert "| 0.70 (0.50 - 0.90) |" in row
    assert "| 0.90 (0.83 - 1.00) |" in row  # against --no-changelog: 0.83, 0.9, 1.0
