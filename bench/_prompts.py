"""Prompt text shared by bench/decode.py and bench/llamacpp_oracle.py (which runs in llama.cpp's own environment, so
this module imports nothing)."""

#: A paragraph about lighthouses, up to "Today most lighthouses are automated": each script ends it its own way.
LIGHTHOUSE = (
    "The history of the lighthouse is a story of engineering, commerce and human courage. "
    "Long before electric lamps, coastal communities lit fires on hilltops to warn ships away from rocks "
    "and to guide them into safe harbours. The Pharos of Alexandria, built in the third century BC, "
    "stood for more than a thousand years and became one of the wonders of the ancient world. "
    "In the eighteenth and nineteenth centuries, as trade across the oceans grew, governments built "
    "towers along dangerous coasts and staffed them with keepers who trimmed wicks, polished lenses "
    "and kept logs of passing vessels through long winter nights. The Fresnel lens, invented in 1822, "
    "concentrated the light of a single flame into a beam that could be seen more than twenty miles "
    "away, and it transformed the safety of navigation. Keepers and their families often lived in "
    "isolation for months, rowing to the mainland for supplies when the weather allowed. "
    "Today most lighthouses are automated"
)
