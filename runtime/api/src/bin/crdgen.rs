//! Writes Bosun's CRDs, one YAML file each, into the directory given as the only argument
//! (normally `deploy/crds`).

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(dir), None) = (args.next(), args.next()) else {
        eprintln!(
            "usage: crdgen DIR   (for example: cargo run -p bosun-api --bin crdgen -- deploy/crds)"
        );
        return ExitCode::from(2);
    };
    let dir = PathBuf::from(dir);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("crdgen: cannot create {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    for (file, crd) in bosun_api::crd::all() {
        let text = match bosun_api::crd::render(&crd) {
            Ok(text) => text,
            Err(e) => {
                eprintln!("crdgen: {e}");
                return ExitCode::FAILURE;
            }
        };
        let path = dir.join(file);
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("crdgen: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("wrote {}", path.display());
    }
    ExitCode::SUCCESS
}
