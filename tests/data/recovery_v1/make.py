"""Writes tests/data/recovery_v1 (README.md): python make.py DEST WORK."""
import shutil
import sys
from pathlib import Path

from stable_baselines3 import PPO

import quarl
from quarl.recovery import RecoverConfig, run_recover

dest = Path(sys.argv[1])
work = Path(sys.argv[2])
shutil.rmtree(work, ignore_errors=True)
work.mkdir(parents=True)
model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu",
            policy_kwargs={"net_arch": [16]})
model.learn(64)
agent = work / "CartPole-v1.zip"
model.save(agent)
config = RecoverConfig(precision="int4-block", rounds=2, max_rounds=2, episodes_per_round=2, updates_per_round=20,
                       finetune_steps=0, closed_loop=False)
loaded = quarl.load(agent, env="CartPole-v1")
out = work / "rec"
run_recover(agent, loaded.env_spec, loaded.policy, config, out)
shutil.rmtree(dest, ignore_errors=True)
dest.mkdir(parents=True)
for rel in ["CartPole-v1.zip", "CartPole-v1/args.yml", "CartPole-v1/config.yml", "CartPole-v1/original.zip",
            "CartPole-v1/recovery.json", "export/policy.onnx", "export/policy.json"]:
    (dest / "folder" / rel).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(out / rel, dest / "folder" / rel)
shutil.copy(out / ".recover" / "state.pt", dest / "state.pt")
print(sorted(p.relative_to(out).as_posix() for p in out.rglob("*")))
