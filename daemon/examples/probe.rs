use sparkd::model::*;
fn main() {
    let f: serde_json::Value = serde_json::from_str(&std::fs::read_to_string("daemon/tests/fixtures/greedy_smollm2.json").unwrap()).unwrap();
    let ci: usize = std::env::args().nth(1).unwrap().parse().unwrap();
    let k: usize = std::env::args().nth(2).unwrap().parse().unwrap();
    let c = &f["cases"][ci];
    let ids = |key: &str| -> Vec<u32> { c[key].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect() };
    let mut toks = ids("prompt_ids");
    toks.extend(&ids("expected_ids")[..k]);
    let m = Model::load(std::path::Path::new("/root/.local/share/sparkd/models/smollm2-135m-instruct.gguf")).unwrap();
    let mut kv = m.new_kv_cache(1024);
    let mut ws = Workspace::new(2);
    let mut t = BlockTable::default();
    kv.reserve(&mut t, toks.len()).unwrap();
    let step: usize = std::env::args().nth(3).map(|s| s.parse().unwrap()).unwrap_or(10000);
    let mut pos = 0;
    while pos < toks.len() {
        let end = (pos + step).min(toks.len());
        m.forward(&[SeqInput { table: &t, tokens: &toks[pos..end], start_pos: pos, want_logits: end == toks.len() }], &mut kv, &mut ws).unwrap();
        pos = end;
    }
    let l = ws.logits(0, m.config.vocab_size);
    let mx = l.iter().cloned().fold(f32::MIN, f32::max);
    let lse = mx + l.iter().map(|x| (x - mx).exp()).sum::<f32>().ln();
    let mut idx: Vec<usize> = (0..l.len()).collect();
    idx.sort_by(|&a, &b| l[b].partial_cmp(&l[a]).unwrap());
    for &i in &idx[..5] { println!("{i} {:.4}", l[i] - lse); }
}
