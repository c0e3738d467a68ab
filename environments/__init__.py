"""Gymnasium text environments with language feedback for R3L (see ``environments.base``).

Ids: r3l/CoinCollector (the default), r3l/TextWorldExpress, r3l/ScienceWorld, r3l/TextWorld,
r3l/ALFWorld, r3l/WebShop, r3l/Math, r3l/Countdown, and the toy r3l/ToyCorridor, r3l/ToyWord.
``make(id, env_config)`` builds one; every option is a constructor keyword of its class.
"""

from environments.base import TextEnv
from environments.registry import make, register, registered

register("r3l/ToyCorridor", "environments.toy:ToyCorridorEnv")
register("r3l/ToyWord", "environments.toy:ToyWordEnv")
register("r3l/CoinCollector", "environments.twx:CoinCollectorEnv")
register("r3l/TextWorldExpress", "environments.twx:TextWorldExpressEnv")
register("r3l/ScienceWorld", "environments.sciworld:ScienceWorldEnv")
register("r3l/TextWorld", "environments.textworld_games:TextWorldEnv")
register("r3l/ALFWorld", "environments.alfworld_env:ALFWorldEnv")
register("r3l/WebShop", "environments.webshop:WebShopEnv")
register("r3l/Math", "environments.math_env:MathEnv")
register("r3l/Countdown", "environments.countdown:CountdownEnv")

__all__ = ["TextEnv", "make", "register", "registered"]
