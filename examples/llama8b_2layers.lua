-- examples/llama8b_2layers.lua: Llama-3.1-8B cut to 2 layers, at full width and length. Peak memory is the
-- per-layer working set plus the checkpoints, so this proves the long-length memory plan of the full model in a
-- fraction of the time. It also shows inheritance: start from a shipped spec and override a few keys.
return cpgen.extend(cpgen.load("llama8b"), {
  model = { layers = 2 },
  train = { steps = 2 },
})
