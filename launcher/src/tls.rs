//! rustls needs one process-wide crypto provider; the launcher uses ring (as the trainer does)
//! so that no second TLS stack (aws-lc) is compiled in.
pub fn install_ring_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err only if another provider was installed first, which is just as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
