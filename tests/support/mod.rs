#![allow(dead_code)]
pub mod moto;
