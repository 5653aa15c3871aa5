//! The binary's environment as a test runs it.

use std::path::Path;
use std::process::Command;

/// A temporary directory (gone when dropped) holding `config.yaml` with `yaml`, and
/// that file's path.
pub fn config_file(yaml: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(&cfg, yaml).unwrap();
    (dir, cfg)
}

/// The environment of a process that no credentials reached (a pod neither IRSA nor
/// EKS Pod Identity reached): none anywhere the SDK's default chain looks, `home` as
/// HOME, and no instance metadata service (nothing leaves loopback).
pub fn without_credentials(cmd: &mut Command, home: &Path) {
    for k in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_ROLE_ARN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    ] {
        cmd.env_remove(k);
    }
    cmd.env("HOME", home)
        .env("AWS_CONFIG_FILE", home.join("no-config"))
        .env("AWS_SHARED_CREDENTIALS_FILE", home.join("no-credentials"))
        .env("AWS_EC2_METADATA_DISABLED", "true");
}
