"""A multi-turn conversation (the Conversations API) on the real default model, driven by the
official openai SDK: the second answer needs a fact only the first turn gave."""

from tests.e2e.conftest import MODEL


def test_second_turn_uses_the_first_turns_fact(client):
    conv = client.conversations.create(metadata={"test": "e2e"})
    first = client.responses.create(model=MODEL, conversation=conv.id, temperature=0,
                                    max_output_tokens=40, input="My cat is called Tiberius.")
    assert first.status in ("completed", "incomplete") and first.conversation.id == conv.id
    second = client.responses.create(model=MODEL, conversation={"id": conv.id},
                                     temperature=0, max_output_tokens=40,
                                     input="What is my cat called? Answer with the name.")
    assert second.status in ("completed", "incomplete")
    assert "Tiberius" in second.output_text, second.output_text
    items = client.conversations.items.list(conv.id, order="asc").data
    assert [i.role for i in items] == ["user", "assistant", "user", "assistant"]
    assert items[0].content[0].text == "My cat is called Tiberius."
    assert items[3].id == second.output[-1].id
    client.conversations.delete(conv.id)
