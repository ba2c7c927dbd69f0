"""`pretrain`: the Hydra main of training. `pretrain experiment=demo model=bert_mini ...`"""

import hydra
from omegaconf import DictConfig

from pretrain.paths import CONF_DIR
from pretrain.run import run_or_exit


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_or_exit(cfg)


if __name__ == "__main__":
    main()
