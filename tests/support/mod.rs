#![allow(dead_code)]
pub mod moto;
pub mod rbac;
