"""A handwritten miniature ALFWorld data folder (the real games cannot be fetched on this machine).

The games use ALFWorld's own PDDL domain and text grammar (shipped in the ``alfworld`` package)
with small problems written here, laid out as ``alfworld-download`` lays out the real data:
``json_2.1.1/<split>/<task>/<trial>/{traj_data.json, game.tw-pddl}``.
"""

import json
import os


def _alfworld_logic():
    import alfworld

    data = os.path.join(os.path.dirname(alfworld.__file__), "data")
    with open(os.path.join(data, "alfred.pddl")) as f:
        domain = f.read()
    with open(os.path.join(data, "alfred.twl2")) as f:
        grammar = f.read()
    return domain, grammar


def _name(kind, *coords):
    parts = [kind] + [str(c).replace("-", "_minus_").replace(".", "_dot_").replace("+", "_plus_") for c in coords]
    return "_bar_".join(parts)


def _problem(target_obj, target_recep, extra_objects):
    counter1 = _name("CounterTop", "-01.00", "+00.90", "+01.00")
    counter2 = _name("CounterTop", "+01.50", "+00.90", "-00.50")
    fridge = _name("Fridge", "-02.00", "+00.00", "+01.00")
    cabinet = _name("Cabinet", "+00.50", "+01.80", "-01.00")
    locs = {
        "start": "loc_bar__minus_1_bar_1_bar_0_bar_30",
        counter1: "loc_bar__minus_1_bar_2_bar_0_bar_30",
        counter2: "loc_bar_2_bar_1_bar_1_bar_45",
        fridge: "loc_bar__minus_2_bar_1_bar_0_bar_30",
        cabinet: "loc_bar_1_bar__minus_1_bar_2_bar_0",
    }
    receps = {counter1: "CounterTopType", counter2: "CounterTopType", fridge: "FridgeType", cabinet: "CabinetType"}
    objects = {}  # id -> (type, receptacle)
    for i, (otype, where) in enumerate([(target_obj, counter2)] + list(extra_objects)):
        where = {"counter1": counter1, "counter2": counter2, "fridge": fridge, "cabinet": cabinet}.get(where, where)
        objects[_name(otype, f"+0{i}.25", "+00.91", f"-0{i}.75")] = (otype + "Type", where)
    otypes = sorted({t for t, _ in objects.values()})
    rtypes = sorted(set(receps.values()))
    decl = ["agent1 - agent"] + [f"{o} - object" for o in objects] + [f"{r} - receptacle" for r in receps]
    decl += [f"{loc} - location" for loc in sorted(set(locs.values()))]
    decl += [f"{t} - otype" for t in otypes] + [f"{t} - rtype" for t in rtypes]
    init = [f"(atLocation agent1 {locs['start']})"]
    for r, t in receps.items():
        init += [f"(receptacleAtLocation {r} {locs[r]})", f"(receptacleType {r} {t})"]
    init += [f"(openable {fridge})", f"(openable {cabinet})"]
    for o, (t, r) in objects.items():
        init += [
            f"(objectType {o} {t})",
            f"(inReceptacle {o} {r})",
            f"(objectAtLocation {o} {locs[r]})",
            f"(pickupable {o})",
        ]
    init += [f"(canContain {rt} {ot})" for rt in rtypes for ot in otypes]
    goal = (
        f"(exists (?r - receptacle) (exists (?o - object) (and (receptacleType ?r {target_recep}Type) "
        f"(objectType ?o {target_obj}Type) (inReceptacle ?o ?r))))"
    )
    return (
        "(define (problem plan_mini)\n (:domain alfred)\n (:objects\n  " + "\n  ".join(decl) + "\n )\n"
        " (:init\n  " + "\n  ".join(init) + "\n  (= (total-cost) 0)\n )\n (:goal (and " + goal + "))\n)\n"
    )


GAMES = {
    # split folder -> [(task folder, target object, target receptacle, other objects, solvable)]
    "train": [
        (
            "pick_and_place_simple-Apple-None-Fridge-1",
            "Apple",
            "Fridge",
            [("Mug", "counter2"), ("Knife", "counter1"), ("Bread", "counter1")],
            True,
        ),
        ("pick_and_place_simple-Mug-None-Cabinet-2", "Mug", "Cabinet", [("Apple", "counter1")], True),
        ("pick_and_place_simple-Egg-None-Fridge-3", "Egg", "Fridge", [], False),  # marked unsolvable
        ("pick_and_place_simple-Cup-None-Cabinet-4/movable", "Cup", "Cabinet", [], True),
    ],  # skipped
    "valid_seen": [("pick_and_place_simple-Bread-None-Fridge-5", "Bread", "Fridge", [("Apple", "counter1")], True)],
    "valid_unseen": [("pick_and_place_simple-Knife-None-Cabinet-6", "Knife", "Cabinet", [], True)],
}


def write_mini_alfworld(root):
    """Write the miniature data folder under ``root``; returns ``root``."""
    domain, grammar = _alfworld_logic()
    for split, games in GAMES.items():
        for folder, obj, recep, extra, solvable in games:
            d = os.path.join(root, "json_2.1.1", split, folder, "trial_T0")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "traj_data.json"), "w") as f:
                json.dump({"task_type": "pick_and_place_simple"}, f)
            task = f"put some {obj.lower()} in {recep.lower()}"
            game = {
                "pddl_domain": domain,
                "grammar": grammar.replace("UNKNOWN GOAL", task),
                "pddl_problem": _problem(obj, recep, extra),
                "solvable": solvable,
            }
            with open(os.path.join(d, "game.tw-pddl"), "w") as f:
                json.dump(game, f)
    return str(root)
