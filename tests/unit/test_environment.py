from tune_advisor import environment


def test_a_benchmark_line_names_the_cpu_its_flags_and_a_device_other_than_the_cpu(monkeypatch):
    # GIVEN this machine: a Zen 3 without fast bf16
    monkeypatch.setattr(environment, "cpu_model", lambda: "AMD EPYC 7B13")
    monkeypatch.setattr(environment, "cpu_flags", lambda: ["avx2"])
    assert environment.machine_line() == "CPU: AMD EPYC 7B13; flags: avx2"
    # AND a saved GPU run's environment, described as it was measured, not as this machine is
    saved = {"cpu_model": "Intel(R) Xeon(R) Platinum 8480+", "cpu_flags": ["amx_bf16", "avx512_bf16"],
             "device": "cuda", "device_name": "NVIDIA H200"}
    assert environment.machine_line(saved=saved) == (
        "CPU: Intel(R) Xeon(R) Platinum 8480+; flags: amx_bf16, avx512_bf16\ndevice: NVIDIA H200")
    # AND a CPU without any of the flags that decide bf16 says so
    assert environment.machine_line(saved={"cpu_model": "Neoverse-N1"}) == "CPU: Neoverse-N1; flags: none of note"
