//! Compiles `proto/startline/v1/*.proto` with the pure-Rust `protox` compiler (no system protoc needed),
//! writes the descriptor set that gRPC reflection serves, and generates prost types and tonic stubs.
use prost::Message;
use std::path::PathBuf;

/// The closed enums are kept in collector snapshots, so they derive serde.
const SERDE: &str = "#[derive(serde::Serialize, serde::Deserialize)]";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/startline/v1/lifecycle.proto"];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("startline_v1_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .type_attribute(".startline.v1.PoolKind", SERDE)
        .type_attribute(".startline.v1.PriorityClass", SERDE)
        .type_attribute(".startline.v1.WaitReason", SERDE)
        .type_attribute(".startline.v1.PreparingPhase", SERDE)
        .type_attribute(".startline.v1.Outcome", SERDE)
        .type_attribute(".startline.v1.StepOrigin", SERDE)
        .compile_fds(fds)?;
    Ok(())
}
