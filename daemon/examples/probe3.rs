use sparkd::model::*;
fn main() {
    let f: serde_json::Value = serde_json::from_str(&std::fs::read_to_string("daemon/tests/fixtures/greedy_smollm2.json").unwrap()).unwrap();
    let ci: usize = std::env::args().nth(1).unwrap().parse().unwrap();
    let c = &f["cases"][ci];
    let ids = |key: &str| -> Vec<u32> { c[key].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect() };
    let refv: Vec<f64> = serde_json::from_str(&std::fs::read_to_string(format!("/tmp/ref/ref{ci}.json")).unwrap()).unwrap();
    let mut toks = ids("prompt_ids");
    let exp = ids("expected_ids");
    let m = Model::load(std::path::Path::new("/root/.local/share/sparkd/models/smollm2-135m-instruct.gguf")).unwrap();
    let mut kv = m.new_kv_cache(1024);
    let mut ws = Workspace::new(2);
    let mut t = BlockTable::default();
    kv.reserve(&mut t, toks.len() + 40).unwrap();
    let mut pos = 0; let mut errs = vec![];
    for i in 0..32 {
        m.forward(&[SeqInput { table: &t, tokens: &toks[pos..], start_pos: pos, want_logits: true }], &mut kv, &mut ws).unwrap();
        pos = toks.len();
        let l = ws.logits(0, m.config.vocab_size);
        let mx = l.iter().cloned().fold(f32::MIN, f32::max);
        let lse = mx + l.iter().map(|x| (x - mx).exp()).sum::<f32>().ln();
        errs.push(((l[exp[i] as usize] - lse) as f64 - refv[i]).abs());
        toks.push(exp[i]);
    }
    let mean = errs.iter().sum::<f64>() / 32.0; let max = errs.iter().cloned().fold(0.0, f64::max);
    println!("ours mean|err| {mean:.4} max {max:.4}");
}
