//! What a GPU backend reads, checked field by field: on the real NVML backend (needs an
//! NVIDIA GPU, run with `--ignored` on a GPU node; read only: no setter is called) and
//! on its simulated twin, with the same checks.

use telemetry::gpu_backend::{GpuBackend, GpuReading};

/// Every field of one reading is present and physically plausible.
fn check_reading(g: &GpuReading) {
    let at = format!("gpu {} ({})", g.index, g.name);
    assert!(!g.name.is_empty(), "{at}: name");
    assert!(!g.uuid.is_empty(), "{at}: uuid");
    assert!(
        g.min_limit_w > 0.0 && g.min_limit_w <= g.max_limit_w,
        "{at}: limit constraints {}..{}",
        g.min_limit_w,
        g.max_limit_w
    );
    for (what, w) in [
        ("enforced", g.power_limit_w),
        ("default", g.default_limit_w),
    ] {
        assert!(
            (g.min_limit_w..=g.max_limit_w).contains(&w),
            "{at}: {what} limit {w} outside {}..={}",
            g.min_limit_w,
            g.max_limit_w
        );
    }
    assert!(
        g.power_w > 0.0 && g.power_w <= g.max_limit_w * 1.5,
        "{at}: power {} W",
        g.power_w
    );
    assert!(
        (0.0..=120.0).contains(&g.temp_c),
        "{at}: temperature {}",
        g.temp_c
    );
    assert!(g.sm_clock_mhz > 0.0, "{at}: SM clock");
    assert!(g.mem_clock_mhz > 0.0, "{at}: memory clock");
    assert!(
        g.sm_clock_max_mhz >= g.sm_clock_mhz && g.sm_clock_min_mhz <= g.sm_clock_max_mhz,
        "{at}: SM clock {} outside {}..={}",
        g.sm_clock_mhz,
        g.sm_clock_min_mhz,
        g.sm_clock_max_mhz
    );
    assert!(
        (0.0..=100.0).contains(&g.utilization_pct),
        "{at}: utilization {}",
        g.utilization_pct
    );
    assert!(g.energy_j.is_some_and(|j| j >= 0.0), "{at}: energy counter");
}

/// Reads every GPU twice, a second apart: each reading plausible, energy counters
/// that never go back.
fn check_backend(b: &mut dyn GpuBackend) {
    let n = b.count().expect("GPU count");
    assert!(n > 0, "{}: no GPU", b.name());
    let first: Vec<GpuReading> = b
        .read_all()
        .expect("read")
        .into_iter()
        .map(|r| r.expect("every GPU reads"))
        .collect();
    std::thread::sleep(std::time::Duration::from_secs(1));
    let second: Vec<GpuReading> = b
        .read_all()
        .expect("read")
        .into_iter()
        .map(|r| r.expect("every GPU reads"))
        .collect();
    assert_eq!(first.len(), n as usize);
    for (a, z) in first.iter().zip(&second) {
        check_reading(a);
        check_reading(z);
        assert_eq!(a.uuid, z.uuid);
        assert!(
            z.energy_j >= a.energy_j,
            "gpu {}: energy went back",
            a.index
        );
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn nvml_reads_every_field_of_every_gpu() {
    let mut b = sources::nvml::NvmlBackend::open().expect("NVML opens");
    check_backend(&mut b);
}

#[test]
fn the_simulated_twin_reads_every_field_of_every_gpu() {
    let model = telemetry::GpuModel::builtin("A40").expect("A40");
    let mut b = agent::SimGpus::new(4, model, 7).live();
    check_backend(&mut b);
}
