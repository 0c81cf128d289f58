use super::*;

#[test]
fn smoke_kernels_pass_on_cpu_threads() {
    for n in [0, 1, 255, 1000] {
        vector_add(Backend::Host, n, 7).unwrap();
    }
    let r = ordering_probe(Backend::Host, 500, 50, 3, Duration::from_secs(10)).unwrap();
    assert_eq!(
        r,
        ProbeReport {
            rounds: 50,
            elements: 500
        }
    );
    arch_check(Backend::Host, 32, 99).unwrap();
}

#[test]
fn random_data_is_spread_and_deterministic() {
    let v: Vec<f32> = (0..1000).map(|i| random_f32(1, i)).collect();
    assert!(v.iter().all(|x| (-100.0..100.0).contains(x)));
    assert!(v.iter().any(|x| *x < -50.0) && v.iter().any(|x| *x > 50.0));
    assert_eq!(random_f32(1, 5), v[5]);
    assert_ne!(random_f32(2, 5), v[5]);
}

#[test]
fn probe_checker_reports_a_stale_word_and_releases_the_kernel() {
    let n = 16;
    let mut data: Vec<u64> = (0..n as u64).map(|i| probe_value(9, 1, i)).collect();
    data[11] ^= 1; // what a missing release would leave behind
    let mut ctl = ProbeControl {
        flag: 1,
        ..Default::default()
    };
    let e = check_probe_rounds(data.as_ptr(), &raw mut ctl, n, 1, 9, Duration::from_secs(1))
        .unwrap_err();
    assert!(matches!(e, SmokeError::Mismatch { index: 11, .. }), "{e}");
    assert_eq!(ctl.ack, u64::MAX);
}

#[test]
fn probe_checker_times_out_when_nothing_is_published() {
    let data = [0u64; 4];
    let mut ctl = ProbeControl::default();
    let e = check_probe_rounds(
        data.as_ptr(),
        &raw mut ctl,
        4,
        1,
        0,
        Duration::from_millis(20),
    )
    .unwrap_err();
    assert!(matches!(e, SmokeError::Timeout(_)), "{e}");
}
