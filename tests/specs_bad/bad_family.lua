-- expect: model.family = "mistral"
-- expect: "llama" or "qwen3"
return cpgen.extend(cpgen.load("tiny"), { model = { family = "mistral" } })
