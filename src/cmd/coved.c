/* coved: control plane + node gateway (placeholder until api/ and node/ land). */
int main(void)
{
        return 1;
}
