/* cove CLI (placeholder until the verbs land). */
int main(void)
{
        return 1;
}
